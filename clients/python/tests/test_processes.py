"""session.processes against a real daemon: pipes and TTY processes, following output to its end,
resuming from a cursor on a brand-new client, retention gaps counted from the offsets, errors."""

from __future__ import annotations

import json
import signal

import pytest
from conftest import Daemon, session_env
from corral_client import (
    Client,
    Cursor,
    Follow,
    InvalidArgument,
    NotFound,
    OutputChunk,
    ProcessState,
    ResourceExhausted,
)

MIB = 1024 * 1024


@pytest.fixture
def session(client, workspace):
    with client.open_session(workspace, "workspace-write", env=session_env(workspace)) as s:
        yield s


def read_until(follow: Follow, needle: str, limit: int = 200) -> str:
    """Consumes chunks from `follow` until their text contains `needle`."""
    text = ""
    for chunk in follow:
        text += chunk.data.decode(errors="replace")
        if needle in text:
            return text
        limit -= 1
        if limit == 0:
            break
    raise AssertionError(f"{needle!r} never came; got {text!r}")


def test_a_pipe_process_takes_stdin_and_is_followed_to_its_end(session):
    proc = session.processes.start(script="echo start:$GREETING; tr a-z A-Z; exit 3", env={"GREETING": "hi"})
    assert isinstance(proc.id, int) and proc.tty is False
    proc.write("abc\n")
    proc.write(b"def\n")
    proc.close_stdin()
    follow = proc.follow()
    chunks = list(follow)
    assert all(isinstance(c, OutputChunk) and c.missed == 0 for c in chunks)
    assert b"".join(c.data for c in chunks) == b"start:hi\nABC\nDEF\n"
    # Offsets are contiguous and the cursor covers everything yielded.
    assert [c.offset for c in chunks] == [sum(len(x.data) for x in chunks[:i]) for i in range(len(chunks))]
    assert follow.cursor == Cursor(chunks[-1].seq, 17)
    assert follow.done and follow.missed_bytes == 0
    assert follow.state == ProcessState(running=False, exit_code=3, closed=True, output_bytes=17)
    # Iterating a finished follower again yields nothing.
    assert list(follow) == []
    # A read from the start returns the same bytes; one after the cursor returns none.
    r = proc.read()
    assert r.data == b"start:hi\nABC\nDEF\n" and not r.gap and not r.more
    assert r.last_seq == chunks[-1].seq
    after = proc.read(after_seq=r.last_seq)
    assert after.chunks == [] and after.last_seq == r.last_seq and after.state.closed
    # Writing after stdin closed is refused.
    with pytest.raises(InvalidArgument) as e:
        proc.write("x")
    assert "closed" in e.value.message
    # Listed until terminated.
    [info] = session.processes.list()
    assert (info.id, info.tty, info.escalated, info.state.exit_code) == (proc.id, False, False, 3)
    assert info.command[-1] == "echo start:$GREETING; tr a-z A-Z; exit 3"
    state = proc.terminate()
    assert state.closed and not state.running
    assert session.processes.list() == []
    with pytest.raises(NotFound):
        proc.read()


def test_a_tty_process_is_resized_and_signalled(session):
    proc = session.processes.start(
        script="trap 'echo got-usr1' USR1; stty size; while read l; do echo \"echo:$l\"; stty size; done",
        tty=True,
        rows=30,
        cols=100,
    )
    follow = proc.follow(wait=0.5)
    assert "30 100" in read_until(follow, "30 100")
    proc.resize(40, 120)
    proc.write("hello\n")
    text = read_until(follow, "40 120")
    assert "echo:hello" in text
    proc.signal(signal.SIGUSR1)
    read_until(follow, "got-usr1")
    proc.signal("SIGUSR1")
    read_until(follow, "got-usr1")
    [info] = session.processes.list()
    assert info.tty and info.state.running and not info.escalated
    # A number works too: TERM ends it, the follower runs to the end of the output.
    proc.signal(int(signal.SIGTERM))
    list(follow)
    assert follow.done and follow.missed_bytes == 0
    assert follow.state.exit_code == 128 + signal.SIGTERM and follow.state.closed
    proc.terminate()


def test_following_resumes_from_a_cursor_on_a_new_client(daemon, workspace):
    expected = "".join(f"line{i}\n" for i in range(1, 301))
    first = Client(daemon.target, timeout=60)
    # Not a `with` block: the session must outlive this client.
    session = first.open_session(workspace, "read-only", env=session_env(workspace))
    proc = session.processes.start(["sh", "-c", "for i in $(seq 1 300); do echo line$i; sleep 0.002; done"])
    got = b""
    follow = proc.follow(wait=0.5)
    for chunk in follow:
        got += chunk.data
        break
    # The same follower goes on where it stopped...
    for chunk in follow:
        got += chunk.data
        if len(got) > 200:
            break
    assert follow.cursor.offset == len(got) and follow.missed_bytes == 0
    # ...and its cursor survives the client: store it, close everything, come back.
    stored = json.dumps(follow.cursor)
    first.close()

    with Client(daemon.target, timeout=60) as second:
        again = second.session(session.id)
        resumed = again.processes.attach(proc.id).follow(after_seq=json.loads(stored))
        rest = b"".join(c.data for c in resumed)
        assert resumed.missed_bytes == 0 and resumed.state.exit_code == 0
        assert (got + rest).decode() == expected
        # A bare seq (no offset) resumes too.
        seq = json.loads(stored)[0]
        bare = again.processes.attach(proc.id).follow(seq)
        assert (got + b"".join(c.data for c in bare)).decode() == expected
        again.close()
    with Client(daemon.target, timeout=10) as third, pytest.raises(NotFound):
        third.session(session.id).processes.list()


def test_a_gap_reports_exactly_how_many_bytes_were_lost(session):
    # 3 MiB of numbered 16-byte records; the daemon keeps the first and the last 512 KiB.
    proc = session.processes.start(["seq", "-f", "%015g", "1", "196608"])
    state = proc.wait(timeout=60)
    assert state.closed and state.exit_code == 0
    total = state.output_bytes
    assert total == 3 * MIB

    # From the start, in several reads (max_bytes), after the output closed.
    follow = proc.follow(max_bytes=256 * 1024)
    chunks = list(follow)
    data = b"".join(c.data for c in chunks)
    assert len(data) == MIB
    assert data.startswith(b"000000000000001\n000000000000002\n")
    assert data.endswith(b"000000000196608\n")
    last = chunks[-1]
    assert last.offset + len(last.data) == total
    # One gap, between the two windows, of exactly the bytes not retained.
    gaps = [(i, c.missed) for i, c in enumerate(chunks) if c.missed]
    assert len(gaps) == 1
    i, missed = gaps[0]
    assert missed == total - MIB == 2 * MIB
    assert chunks[i].offset - chunks[i - 1].end == missed
    assert follow.missed_bytes == missed
    assert len(data) + follow.missed_bytes == total

    # Resumed from the last chunk of the head: the loss comes first, still counted exactly.
    head_end = chunks[i - 1]
    resumed = proc.follow(after_seq=Cursor(head_end.seq, head_end.end))
    first = next(resumed)
    assert first.missed == 2 * MIB and first.offset == chunks[i].offset
    assert len(first.data) + sum(len(c.data) for c in resumed) == MIB // 2
    # From a bare seq the follower cannot know how much it missed: it says so (None).
    bare = proc.follow(after_seq=head_end.seq)
    assert next(bare).missed is None
    proc.terminate()


def test_bad_input_is_a_typed_error(client, session):
    ghost = session.processes.attach(99_999_999)
    for call in (ghost.read, ghost.terminate, ghost.close_stdin, lambda: ghost.signal("TERM")):
        with pytest.raises(NotFound):
            call()
    with pytest.raises(NotFound):
        client.session("0" * 32).processes.list()
    with pytest.raises(TypeError):
        session.processes.start()
    with pytest.raises(TypeError):
        session.processes.start("echo hi")
    with pytest.raises(TypeError):
        session.processes.start(["true"], script="true")
    with pytest.raises(InvalidArgument) as e:
        session.processes.start([])
    assert "empty" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        session.processes.start(["true"], tty=True, rows=5000)
    assert "rows must be between" in e.value.message
    with pytest.raises(InvalidArgument):
        session.processes.start(["true"], env={"A=B": "x"})

    with session.processes.start(["sleep", "30"]) as proc:
        with pytest.raises(InvalidArgument) as e:
            proc.signal("SEGV")
        assert "use one of" in e.value.message
        with pytest.raises(TypeError):
            proc.signal(1.5)
        with pytest.raises(InvalidArgument) as e:
            proc.resize(10, 10)
        assert "has no PTY" in e.value.message
        with pytest.raises(InvalidArgument) as e:
            proc.read(wait=60)
        assert "wait at most" in e.value.message
        with pytest.raises(InvalidArgument):
            proc.read(max_bytes=64 * MIB)
        with pytest.raises(InvalidArgument):
            proc.write(b"x" * (2 * MIB))
        with pytest.raises(ValueError):
            proc.read(after_seq=2**64 - 1)
    # Leaving the block terminated it.
    assert session.processes.list() == []


def test_processes_hold_running_command_slots(workspace, tmp_path):
    conf = tmp_path / "limit.toml"
    conf.write_text("[policy.default]\nmax_concurrent_commands = 1\n")
    d = Daemon(extra=("--config", str(conf)))
    try:
        with Client(d.target, timeout=30) as c, c.open_session(workspace, "read-only") as s:
            with s.processes.start(["sleep", "30"]):
                with pytest.raises(ResourceExhausted):
                    s.processes.start(["sleep", "30"])
            s.processes.start(["true"]).terminate()  # the slot was freed
    finally:
        d.stop()


class _ScriptedProcess:
    """Stands in for a Process: answers reads from a fixed retained output, as the daemon does."""

    def __init__(self, pieces, total):
        self.pieces = pieces  # [(seq, offset, data)], head then tail
        self.total = total
        self.reads = []

    def read(self, after_seq=None, wait=0.0, max_bytes=0):
        from corral_client import ReadResult

        self.reads.append(after_seq)
        first = 0 if after_seq is None else after_seq + 1
        chunks = [OutputChunk(s, o, d) for s, o, d in self.pieces if s >= first]
        gap = bool(chunks) and any(b.offset != a.end for a, b in zip(chunks, chunks[1:]))
        state = ProcessState(running=False, exit_code=0, closed=True, output_bytes=self.total)
        last = chunks[-1].seq if chunks else after_seq
        return ReadResult(chunks=chunks, gap=gap or bool(chunks and chunks[0].seq != first), more=False,
                          last_seq=last, state=state)


def test_a_cursor_between_the_two_pieces_of_a_cut_chunk():
    """A chunk cut by the retention window comes as two pieces with one seq. A caller that stops
    between them resumes with the second piece only: the cursor's offset drops what it had."""
    # seq 1 is "bbXXXXcc" cut to "bb" (head) and "cc" (tail): 4 bytes lost between.
    proc = _ScriptedProcess([(0, 0, b"aaaa"), (1, 4, b"bb"), (1, 10, b"cc"), (2, 12, b"dd")], total=14)
    follow = Follow(proc, None, 0.0, 0)
    got = [next(follow), next(follow)]
    assert [c.data for c in got] == [b"aaaa", b"bb"]
    # Seq 1 is not complete: the cursor stays on seq 0, with the offset of what was yielded.
    assert follow.cursor == Cursor(0, 6)
    resumed = Follow(proc, follow.cursor, 0.0, 0)
    rest = list(resumed)
    assert [(c.seq, c.offset, c.data, c.missed) for c in rest] == [(1, 10, b"cc", 4), (2, 12, b"dd", 0)]
    assert resumed.missed_bytes == 4 and resumed.cursor == Cursor(2, 14)
    assert proc.reads[-1] == 0
