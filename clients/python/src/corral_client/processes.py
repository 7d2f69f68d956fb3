"""Long-lived processes of a session: the ``corral.v1.Processes`` service.

A process runs in the session's sandbox, with pipes or a PTY, and keeps its output (1 MiB: the
first and the last 512 KiB) in sequence-numbered chunks, so a reader can stop and resume from a
cursor — even on a new connection — and learns exactly how many bytes fell out of that window.
Processes share the session's table with the model's ``exec_command``/``write_stdin``.

    proc = session.processes.start(["python3", "-i"], tty=True)
    proc.write("print(6 * 7)\\n")
    for chunk in proc.follow():
        ...
"""

from __future__ import annotations

import os
import signal as _signal
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import grpc

from ._proto import corral_pb2 as pb
from .errors import CorralError

if TYPE_CHECKING:  # pragma: no cover
    from .client import Session

__all__ = [
    "Cursor",
    "Follow",
    "OutputChunk",
    "Process",
    "ProcessInfo",
    "ProcessState",
    "Processes",
    "ReadResult",
]

PathLike = Union[str, "os.PathLike[str]"]

# A cursor past every chunk: a read from it returns no output and only waits for the state.
_PAST_THE_END = 2**64 - 2
# Longest wait the daemon accepts for one read (ReadProcessRequest.wait_ms).
_MAX_WAIT_S = 30.0


class Cursor(NamedTuple):
    """Where a reader is in a process's output.

    ``seq`` is the last sequence number received (what ``ReadProcessRequest.after_seq`` takes;
    ``None``: nothing yet, read from the start). ``offset`` is the end of the bytes received in the
    process's whole output (``None``: unknown), which lets a follower resumed from this cursor count
    missed bytes exactly. A plain tuple: store it anywhere (JSON makes it a list, which is taken
    back as well) and pass it back to :meth:`Process.follow`.
    """

    seq: int | None
    offset: int | None


@dataclass(frozen=True)
class ProcessState:
    """A process's state: ``running`` (its leader has not exited), ``exit_code`` once it exited
    (``128 + N`` for death by signal N), ``closed`` (the output is closed and the whole tree is
    gone: no more output will come), ``output_bytes`` (output so far)."""

    running: bool
    exit_code: int | None
    closed: bool
    output_bytes: int

    @classmethod
    def _from_pb(cls, m: pb.ProcessState) -> ProcessState:
        return cls(
            running=m.running,
            exit_code=m.exit_code if m.HasField("exit_code") else None,
            closed=m.closed,
            output_bytes=m.output_bytes,
        )


@dataclass(frozen=True)
class OutputChunk:
    """A piece of output: its chunk's ``seq``, its byte ``offset`` in the whole output, ``data``.

    ``missed`` is set by :meth:`Process.follow`: how many bytes right before this chunk fell out
    of the retention window and are lost (0: none; ``None``: some, but the follower was resumed
    from a bare sequence number without an offset, so how many is unknown). Chunks from
    :meth:`Process.read` have ``missed=0``; compare their offsets yourself.
    """

    seq: int
    offset: int
    data: bytes
    missed: int | None = 0

    @property
    def end(self) -> int:
        """The offset just after this chunk's data."""
        return self.offset + len(self.data)


@dataclass(frozen=True)
class ReadResult:
    """One :meth:`Process.read`: the ``chunks`` after the cursor; ``gap`` (output after the cursor
    fell out of the retention window before or between them; their offsets say how much);
    ``more`` (the read stopped at ``max_bytes``: read again at once); ``last_seq`` (the cursor for
    the next read); the process's ``state``."""

    chunks: list[OutputChunk]
    gap: bool
    more: bool
    last_seq: int | None
    state: ProcessState

    @property
    def data(self) -> bytes:
        """The chunks' data, concatenated."""
        return b"".join(c.data for c in self.chunks)


@dataclass(frozen=True)
class ProcessInfo:
    """An entry of :meth:`Processes.list`: the process ``id``, the argv it runs (``command``; a
    script as ``[shell, "-lc", script]``), ``tty``, ``state``, and ``escalated`` (started outside
    the sandbox)."""

    id: int
    command: list[str]
    tty: bool
    state: ProcessState
    escalated: bool


def _signal_name(sig: str | int) -> str:
    if isinstance(sig, _signal.Signals):
        return sig.name
    if isinstance(sig, bool) or not isinstance(sig, (str, int)):
        raise TypeError(f"signal must be a name ('TERM', 'SIGINT', …) or a number, not {sig!r}")
    return str(sig)


def _as_cursor(after_seq: Any) -> Any:
    """A ``(seq, offset)`` pair (a Cursor, or the list it becomes in JSON) as a Cursor."""
    if isinstance(after_seq, (tuple, list)) and not isinstance(after_seq, Cursor):
        if len(after_seq) != 2:
            raise TypeError(f"a cursor is (seq, offset), not {after_seq!r}")
        return Cursor(*after_seq)
    return after_seq


def _cursor_seq(after_seq: int | Cursor | None) -> int | None:
    after_seq = _as_cursor(after_seq)
    seq = after_seq.seq if isinstance(after_seq, Cursor) else after_seq
    # 2**64 - 1 is refused here: the daemon computes `after_seq + 1`, and no process will ever
    # have that many chunks.
    if seq is not None and not 0 <= seq < 2**64 - 1:
        raise ValueError(f"after_seq must be between 0 and 2**64 - 2, not {seq}")
    return seq


def _wait_ms(wait: float) -> int:
    if wait < 0:
        raise ValueError("wait must not be negative")
    return int(round(wait * 1000))


# -- requests and answers, shared by the sync classes below and corral_client.aio -------------


def start_request(
    session_id: str,
    argv: Sequence[str] | None,
    *,
    script: str | None,
    workdir: PathLike | None,
    tty: bool,
    rows: int,
    cols: int,
    env: Mapping[str, str] | None,
    escalated: bool,
) -> pb.StartProcessRequest:
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv is a list; pass a shell script as script=...")
    if (argv is None) == (script is None):
        raise TypeError("give exactly one of argv (a list) and script")
    req = pb.StartProcessRequest(
        session_id=session_id,
        workdir=os.fspath(workdir) if workdir is not None else "",
        tty=tty,
        rows=rows,
        cols=cols,
        env=dict(env or {}),
        with_escalated_permissions=escalated,
    )
    if argv is not None:
        req.argv.args.extend(argv)
    else:
        req.script = script or ""
    return req


def process_infos(resp: pb.ListProcessesResponse) -> list[ProcessInfo]:
    return [
        ProcessInfo(
            id=p.process_id,
            command=list(p.command),
            tty=p.tty,
            state=ProcessState._from_pb(p.state),
            escalated=p.escalated,
        )
        for p in resp.processes
    ]


def write_request(session_id: str, process_id: int, data: bytes | str, close_stdin: bool) -> pb.WriteProcessRequest:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return pb.WriteProcessRequest(
        session_id=session_id, process_id=process_id, data=bytes(data), close_stdin=close_stdin
    )


def read_request(
    session_id: str, process_id: int, after_seq: int | Cursor | None, wait: float, max_bytes: int
) -> pb.ReadProcessRequest:
    req = pb.ReadProcessRequest(
        session_id=session_id, process_id=process_id, wait_ms=_wait_ms(wait), max_bytes=max_bytes
    )
    seq = _cursor_seq(after_seq)
    if seq is not None:
        req.after_seq = seq
    return req


def read_result(resp: pb.ReadProcessResponse) -> ReadResult:
    return ReadResult(
        chunks=[OutputChunk(c.seq, c.offset, c.data) for c in resp.chunks],
        gap=resp.gap,
        more=resp.more,
        last_seq=resp.last_seq if resp.HasField("last_seq") else None,
        state=ProcessState._from_pb(resp.state),
    )


def read_timeout(default: float | None, wait: float, timeout: float | None) -> float | None:
    """A waiting read must not hit the client's default deadline while it waits."""
    if timeout is not None:
        return timeout
    return None if default is None else max(default, wait + 10.0)


def terminated_state(resp: pb.TerminateProcessResponse) -> ProcessState:
    return ProcessState._from_pb(resp.state)


class WaitClock:
    """The reads of :meth:`Process.wait`: each waits at most 30 s, until ``timeout`` is over."""

    def __init__(self, timeout: float | None):
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def next_wait(self) -> float:
        if self.deadline is None:
            return _MAX_WAIT_S
        return min(_MAX_WAIT_S, max(0.0, self.deadline - time.monotonic()))

    def done(self, state: ProcessState) -> bool:
        return state.closed or (self.deadline is not None and time.monotonic() >= self.deadline)


class ProcessBase:
    """What a process handle is, sync (:class:`Process`) or async (``corral_client.aio``)."""

    def __init__(self, session: Any, process_id: int, *, tty: bool | None = None):
        self.session = session
        self.id = process_id
        self.tty = tty

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id}, session={self.session.id!r})"

    def _request(self, cls: Any, **fields: Any) -> Any:
        return cls(session_id=self.session.id, process_id=self.id, **fields)


class Processes:
    """``session.processes``: start, attach to and list the session's processes."""

    def __init__(self, session: Session):
        self.session = session

    def start(
        self,
        argv: Sequence[str] | None = None,
        *,
        script: str | None = None,
        workdir: PathLike | None = None,
        tty: bool = False,
        rows: int = 0,
        cols: int = 0,
        env: Mapping[str, str] | None = None,
        escalated: bool = False,
        timeout: float | None = None,
    ) -> Process:
        """Starts a process and returns as soon as it runs.

        Give exactly one of ``argv`` (run directly, looked up on PATH) and ``script`` (run by the
        session's shell). ``workdir`` is relative to the session's cwd (default: the cwd). ``tty``
        gives it a PTY (stdin, stdout and stderr on one terminal; ``rows``/``cols``, 0 = 24×80);
        otherwise stdin is a pipe you may write to and close, and stdout and stderr are
        interleaved as they arrive. ``env`` adds to the session's environment. ``escalated`` runs
        it outside the sandbox, when the operator's policy allows escalation.
        """
        req = start_request(
            self.session.id, argv, script=script, workdir=workdir, tty=tty, rows=rows, cols=cols,
            env=env, escalated=escalated,
        )  # fmt: skip
        resp = self.session.client._unary("processes", "StartProcess", req, timeout)
        return Process(self.session, resp.process_id, tty=tty)

    def attach(self, process_id: int) -> Process:
        """A handle on a process started earlier (by this or another client, or by the model's
        ``exec_command``). Nothing is sent: an unknown id fails on the first call (NotFound)."""
        return Process(self.session, int(process_id))

    def list(self, *, timeout: float | None = None) -> list[ProcessInfo]:
        """The session's processes, by id."""
        req = pb.ListProcessesRequest(session_id=self.session.id)
        return process_infos(self.session.client._unary("processes", "ListProcesses", req, timeout))


class Process(ProcessBase):
    """A process of a session (from :meth:`Processes.start` or :meth:`Processes.attach`).

    A context manager: leaving the ``with`` block terminates it (an already gone process is fine).
    """

    session: Session

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.terminate()
        except CorralError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        return self.session.client._unary("processes", method, request, timeout)

    def write(self, data: bytes | str, *, close_stdin: bool = False, timeout: float | None = None) -> None:
        """Writes to its stdin (the PTY, or the stdin pipe); a ``str`` is sent as UTF-8. At most
        1 MiB per call. ``close_stdin`` then closes the pipe (pipes only; on a PTY write ``"\\x04"``)."""
        self._call("WriteProcess", write_request(self.session.id, self.id, data, close_stdin), timeout)

    def close_stdin(self, *, timeout: float | None = None) -> None:
        """Closes its stdin pipe (end of file for the process; pipes mode only)."""
        self.write(b"", close_stdin=True, timeout=timeout)

    def read(
        self,
        after_seq: int | Cursor | None = None,
        wait: float = 0.0,
        max_bytes: int = 0,
        *,
        timeout: float | None = None,
    ) -> ReadResult:
        """The retained output after the cursor ``after_seq`` (the previous read's ``last_seq``;
        ``None``: from the first retained byte), waiting up to ``wait`` seconds (at most 30) for
        some when there is none yet, at most ``max_bytes`` of it (0: 1 MiB; at most 4 MiB; the
        first chunk comes whole), and the process's state."""
        req = read_request(self.session.id, self.id, after_seq, wait, max_bytes)
        return read_result(self._call("ReadProcess", req, read_timeout(self.session.client.timeout, wait, timeout)))

    def follow(
        self, after_seq: int | Cursor | None = None, wait: float = 1.0, max_bytes: int = 0
    ) -> Follow:
        """An iterator of the output's chunks from the cursor ``after_seq`` (``None``: the start)
        until the output closes; see :class:`Follow`. ``wait`` is how long each read waits for new
        output (seconds, at most 30)."""
        return Follow(self, after_seq, wait, max_bytes)

    def wait(self, timeout: float | None = None) -> ProcessState:
        """Waits until the process and its whole tree are gone (``state.closed``), or ``timeout``
        seconds (``None``: no limit); returns the latest state. Reads no output."""
        clock = WaitClock(timeout)
        while True:
            state = self.read(_PAST_THE_END, wait=clock.next_wait()).state
            if clock.done(state):
                return state

    def resize(self, rows: int, cols: int, *, timeout: float | None = None) -> None:
        """Sets its PTY's size (1..1000 each; TTY processes only)."""
        self._call("ResizeProcess", self._request(pb.ResizeProcessRequest, rows=rows, cols=cols), timeout)

    def signal(self, sig: str | int, *, timeout: float | None = None) -> None:
        """Sends a signal to its process group: a name with or without ``SIG`` (``"INT"``,
        ``"SIGTERM"``), a number, or a :class:`signal.Signals`. Allowed: HUP, INT, QUIT, KILL,
        USR1, USR2, TERM, CONT, STOP, TSTP, WINCH."""
        self._call("SignalProcess", self._request(pb.SignalProcessRequest, signal=_signal_name(sig)), timeout)

    def terminate(self, *, timeout: float | None = None) -> ProcessState:
        """Kills its whole tree, waits until it is gone, and forgets the process (later calls
        naming it are NotFound); returns its final state."""
        return terminated_state(self._call("TerminateProcess", self._request(pb.TerminateProcessRequest), timeout))


class FollowCore:
    """The bookkeeping of a follower, sync (:class:`Follow`) or async (``corral_client.aio``):
    the cursor, the chunks read but not yet yielded, what was lost. Only the reads differ."""

    def __init__(self, process: Any, after_seq: int | Cursor | None, wait: float, max_bytes: int):
        after_seq = _as_cursor(after_seq)
        _cursor_seq(after_seq)
        if isinstance(after_seq, Cursor):
            seq, offset = after_seq.seq, after_seq.offset
            if seq is None and offset is None:
                offset = 0
        elif after_seq is None:
            seq, offset = None, 0
        else:
            seq, offset = int(after_seq), None
        self.process = process
        self.wait = wait
        self.max_bytes = max_bytes
        self._seq: int | None = seq
        self._offset: int | None = offset
        self._pending: deque[OutputChunk] = deque()
        # Resumed from a bare seq (no offset) and the first read says output right after the
        # cursor was lost: how much cannot be known.
        self._unknown_loss = False
        self._closed = False
        self.state: ProcessState | None = None
        self.missed_bytes = 0

    @property
    def cursor(self) -> Cursor:
        """The position after the last chunk yielded (``Cursor(seq, offset)``)."""
        return Cursor(self._seq, self._offset)

    @property
    def done(self) -> bool:
        """The output is closed and every chunk has been yielded."""
        return self._closed and not self._pending

    def _next_pending(self) -> OutputChunk | None:
        """The next chunk to yield from what was read, or None when a read is needed (or, once
        :attr:`_closed`, when the output is over)."""
        while self._pending:
            chunk = self._take()
            if chunk is not None:
                return chunk
        if self._closed:
            self._account_tail()
        return None

    def _read_args(self) -> dict[str, Any]:
        return {"after_seq": self._seq, "wait": self.wait, "max_bytes": self.max_bytes}

    def _absorb(self, r: ReadResult) -> None:
        """Takes in one read's answer."""
        self.state = r.state
        if self._offset is None and r.gap and r.chunks:
            # The gap is before the first chunk unless it is one between two of them.
            between = any(b.offset != a.end for a, b in zip(r.chunks, r.chunks[1:]))
            self._unknown_loss = not between
        self._pending.extend(r.chunks)
        if r.state.closed and not r.more:
            self._closed = True

    def _take(self) -> OutputChunk | None:
        """The next pending piece, with what was lost right before it; None when the caller
        already had all of it."""
        chunk = self._pending.popleft()
        # The cursor moves past a seq only once all of its pieces are out (a chunk cut by the
        # retention window comes as two pieces with one seq, in one read).
        if not (self._pending and self._pending[0].seq == chunk.seq):
            self._seq = chunk.seq
        missed: int | None
        if self._offset is None:
            missed = None if self._unknown_loss else 0
            self._unknown_loss = False
        elif chunk.end <= self._offset:
            return None  # yielded before this cursor was taken
        elif chunk.offset < self._offset:
            # Partly yielded before: only the rest.
            chunk = OutputChunk(chunk.seq, self._offset, chunk.data[self._offset - chunk.offset :])
            missed = 0
        else:
            missed = chunk.offset - self._offset
            self.missed_bytes += missed
        self._offset = chunk.end
        return OutputChunk(chunk.seq, chunk.offset, chunk.data, missed)

    def _account_tail(self) -> None:
        """Output lost after the last chunk yielded with none of it retained (not expected: the
        window always keeps the last bytes), counted from the final size all the same."""
        state = self.state
        if state is None or self._offset is None:
            return
        if state.output_bytes > self._offset:
            self.missed_bytes += state.output_bytes - self._offset
            self._offset = state.output_bytes


class Follow(FollowCore):
    """Iterates a process's output chunk by chunk until the output closes (:meth:`Process.follow`).

    **Resuming.** :attr:`cursor` is where the caller is: it covers exactly the chunks this
    iterator has yielded. Stop at any time (``break``) and later iterate the same object again, or
    pass the cursor to ``process.follow(after_seq=cursor)`` — on any client, even after this one
    is closed (``client.session(id).processes.attach(process_id)``). Nothing is repeated and
    nothing inside the retention window is lost.

    **Gaps are reported, not raised.** When output after the cursor fell out of the retention
    window (1 MiB: the first and the last 512 KiB), the next chunk's :attr:`OutputChunk.missed`
    is the exact number of bytes lost right before it (from the offsets), and :attr:`missed_bytes`
    adds up the losses of this iterator. The data yielded plus :attr:`missed_bytes` is always the
    whole output after the starting cursor. :attr:`state` is the process's state as of the last
    read.
    """

    process: Process

    def __iter__(self) -> Iterator[OutputChunk]:
        return self

    def __next__(self) -> OutputChunk:
        while True:
            chunk = self._next_pending()
            if chunk is not None:
                return chunk
            if self._closed:
                raise StopIteration
            self._absorb(self.process.read(**self._read_args()))
