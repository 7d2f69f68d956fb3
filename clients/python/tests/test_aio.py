"""corral_client.aio against a real daemon: the same verbs as the sync client, awaited — sessions
(the read-only default, attaching by id), health, typed tools, the bridge, streaming shell,
processes followed with ``async for`` and resumed on a new client, errors with their details."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from conftest import normalize, populate, session_env
from corral_client import Client, Cursor, InvalidArgument, NotFound, ProcessState, pb
from corral_client.aio import AsyncClient, AsyncFollow, AsyncProcess, AsyncSession


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_health_capabilities_and_the_read_only_default(daemon, workspace):
    populate(workspace, {"a.txt": "one\ntwo\n"})

    async def main():
        async with AsyncClient(daemon.target, timeout=30) as client:
            await client.wait_ready(5)
            assert await client.health() == "SERVING"
            assert await client.health("corral.v1.Processes") == "SERVING"
            caps = await client.capabilities()
            assert caps.api_version == "corral.v1"
            # No mode given: read-only, as in the sync client (and the Node one).
            async with await client.open_session(workspace, env=session_env(workspace)) as s:
                assert isinstance(s, AsyncSession) and len(s.id) == 32
                r = await s.shell(["sh", "-c", "echo x > made.txt"])
                assert r.exit_code != 0 and not (workspace / "made.txt").exists()
                assert (await s.read_file("a.txt")).text == "L1: one\nL2: two"
            assert s.closed
            with pytest.raises(NotFound):
                await s.read_file("a.txt")
            await s.close()  # closed already: nothing sent

    run(main())


def test_attach_to_a_session_opened_by_the_sync_client(client, daemon, workspace):
    populate(workspace, {"a.txt": "one\n"})
    with client.open_session(workspace, env=session_env(workspace)) as s:

        async def main():
            async with AsyncClient(daemon.target, timeout=30) as aclient:
                attached = aclient.session(s.id)
                assert (await attached.list_dir(".")).text == f"Absolute path: {workspace}/.\na.txt"
                with pytest.raises(NotFound):
                    await aclient.session("0" * 32).list_dir(".")

        run(main())
        # Still open for its owner: attaching does not take it over.
        assert s.read_file("a.txt").text == "L1: one"


def test_typed_tools_and_the_bridge_answer_as_the_sync_client(client, daemon, workspace):
    populate(workspace, {"a.txt": "one\ntwo\nthree\n", "sub/b.py": "def f():\n    return 1\n"})
    env = session_env(workspace)
    with client.open_session(workspace, "workspace-write", env=env) as s:
        sync = {
            "read": s.read_file("a.txt", offset=2, limit=1),
            "indent": s.read_file("sub/b.py", mode="indentation", offset=2, indentation={"max_levels": 1}),
            "list": s.list_dir(".", depth=2),
            "grep": s.grep_files("return", include="*.py"),
            "tools": s.list_tools("chat", exclude=["read_file"]),
            "invoke": s.invoke("read_file", {"file_path": "a.txt", "limit": 1}, call_id="c1"),
            "shell": s.shell(script="echo hi; exit 3", login=False),
        }

        async def main():
            async with AsyncClient(daemon.target, timeout=30) as aclient:
                a = aclient.session(s.id)
                return {
                    "read": await a.read_file("a.txt", offset=2, limit=1),
                    "indent": await a.read_file(
                        "sub/b.py", mode="indentation", offset=2, indentation={"max_levels": 1}
                    ),
                    "list": await a.list_dir(".", depth=2),
                    "grep": await a.grep_files("return", include="*.py"),
                    "tools": await a.list_tools("chat", exclude=["read_file"]),
                    "invoke": await a.invoke("read_file", {"file_path": "a.txt", "limit": 1}, call_id="c1"),
                    "shell": await a.shell(script="echo hi; exit 3", login=False),
                    "freeform": await a.apply_patch("*** Begin Patch\n*** Add File: new.txt\n+new\n*** End Patch\n"),
                }

        got = run(main())
    for key in ("read", "indent", "list", "grep", "tools", "invoke"):
        assert got[key] == sync[key], key
    assert got["read"].text == "L2: two"
    assert (got["shell"].exit_code, got["shell"].stdout.head) == (3, b"hi\n")
    assert normalize(got["shell"].text) == normalize(sync["shell"].text)
    assert [c.kind for c in got["freeform"].changes] == [pb.FILE_CHANGE_KIND_ADDED]
    assert (workspace / "new.txt").read_text() == "new\n"


def test_shell_stream_events_and_cancel(daemon, workspace):
    async def main():
        async with AsyncClient(daemon.target, timeout=30) as client:
            async with await client.open_session(workspace, env=session_env(workspace)) as s:
                stream = s.shell_stream(["sh", "-c", "echo a; echo b >&2; echo c"])
                events = [e async for e in stream]
                kinds = [e.WhichOneof("event") for e in events]
                assert kinds[0] == "begin" and kinds[-1] == "end" and set(kinds[1:-1]) == {"delta"}
                out = b"".join(e.delta.data for e in events if e.delta.stream == pb.OUTPUT_STREAM_STDOUT)
                assert out == b"a\nc\n" and stream.result.exit_code == 0
                assert (await s.shell_stream(script="exit 7", login=False).wait()).exit_code == 7
                async with s.shell_stream(["sh", "-c", "echo started; sleep 30"]) as long:
                    async for event in long:
                        if event.WhichOneof("event") == "delta":
                            break
                assert long.result is None
                assert (await s.shell(["true"])).exit_code == 0  # the session still works

    run(main())


def test_a_process_followed_with_async_for_and_resumed_on_a_new_client(daemon, workspace):
    async def main():
        async with AsyncClient(daemon.target, timeout=30) as client:
            s = await client.open_session(workspace, env=session_env(workspace))
            proc = await s.processes.start(script="echo start:$GREETING; tr a-z A-Z; exit 3", env={"GREETING": "hi"})
            assert isinstance(proc, AsyncProcess) and proc.tty is False
            await proc.write("abc\n")
            follow = proc.follow(wait=5)
            assert isinstance(follow, AsyncFollow)
            first = await follow.__anext__()
            assert first.data.startswith(b"start:hi") and first.missed == 0
            cursor = follow.cursor
            assert cursor == Cursor(first.seq, len(first.data))
            await proc.write(b"def\n", close_stdin=True)
            [info] = await s.processes.list()
            assert info.id == proc.id and info.command[-1].startswith("echo start")
        # A brand-new client resumes from the cursor: the rest, nothing repeated.
        async with AsyncClient(daemon.target, timeout=30) as other:
            again = other.session(s.id).processes.attach(proc.id)
            rest = again.follow(after_seq=cursor)
            data = first.data + b"".join([c.data async for c in rest])
            assert data == b"start:hi\nABC\nDEF\n"
            assert rest.done and rest.missed_bytes == 0 and rest.cursor.offset == 17
            assert rest.state == ProcessState(running=False, exit_code=3, closed=True, output_bytes=17)
            assert (await again.wait(timeout=5)).closed
            assert (await again.read()).data == data
            state = await again.terminate()
            assert state.closed and await other.session(s.id).processes.list() == []
            with pytest.raises(NotFound):
                await again.read()
            await other.close_session(s.id)

    run(main())


def test_a_tty_process_signal_resize_and_context_manager(daemon, workspace):
    async def main():
        async with AsyncClient(daemon.target, timeout=30) as client:
            async with await client.open_session(workspace, env=session_env(workspace)) as s:
                async with await s.processes.start(
                    script="trap 'echo got-usr1' USR1; echo ready; while :; do sleep 0.05; done",
                    tty=True, rows=10, cols=40,
                ) as proc:  # fmt: skip
                    follow = proc.follow(wait=5)
                    text = ""
                    async for chunk in follow:
                        text += chunk.data.decode()
                        if "ready" in text:
                            break
                    await proc.resize(30, 100)
                    await proc.signal("USR1")
                    async for chunk in follow:
                        text += chunk.data.decode()
                        if "got-usr1" in text:
                            break
                    assert "got-usr1" in text
                # Leaving the block terminated it.
                assert await s.processes.list() == []

    run(main())


def test_errors_carry_their_details(daemon, workspace):
    async def main():
        async with AsyncClient(daemon.target, timeout=30) as client:
            with pytest.raises(InvalidArgument) as e:
                await client.open_session(workspace, pb.SANDBOX_MODE_UNSPECIFIED)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.field_violations[0].field == "mode"
            with pytest.raises(NotFound):
                await client.close_session("0" * 32)
            with pytest.raises(ValueError):
                await client.open_session(workspace, "sandboxed-please")
            s = await client.open_session(workspace, env=session_env(workspace))
            proc = await s.processes.start(["true"])
            with pytest.raises(ValueError):
                await proc.read(after_seq=-1)
            await proc.terminate()
            await s.close()

    run(main())


def test_the_sync_and_async_clients_default_alike():
    """One rule for both: read-only unless told otherwise, the current directory as cwd."""
    import inspect

    for open_session in (Client.open_session, AsyncClient.open_session):
        params = inspect.signature(open_session).parameters
        assert params["mode"].default == "read-only"
        assert params["cwd"].default is None
    sync_verbs = {n for n in dir(Client) if not n.startswith("_")}
    async_verbs = {n for n in dir(AsyncClient) if not n.startswith("_")}
    assert sync_verbs == async_verbs
