"""`corral mcp` driven by the official Python MCP SDK (the `mcp` package), as an MCP host such as
an IDE or agent would: `stdio_client` launches the front, `ClientSession` speaks the protocol."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from conftest import corral_bin

pytest.importorskip("mcp", reason="the mcp package needs Python 3.10+ (run-client-tests.sh installs it there)")

import anyio  # noqa: E402  (an mcp dependency)
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402


def run_front(daemon, args: list[str], body: Callable[[ClientSession], Awaitable[Any]], tmp_path: Path) -> Any:
    """Launches `corral --socket SOCKET mcp ARGS...` over stdio, initializes, runs `body`, and
    shuts the front down the SDK's way (stdin closed, then signals if it lingers)."""
    server = StdioServerParameters(command=str(corral_bin()), args=["--socket", daemon.target, "mcp", *args])
    errlog_path = tmp_path / "mcp.stderr"

    async def main() -> Any:
        with open(errlog_path, "w") as errlog:
            async with stdio_client(server, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    init = await session.initialize()
                    assert init.server_info.name == "corral"
                    assert init.capabilities.tools is not None
                    return await body(session)

    try:
        return anyio.run(main)
    except BaseException:
        print("corral mcp stderr:\n" + errlog_path.read_text(errors="replace"))
        raise


def text_of(result) -> str:
    assert len(result.content) == 1, result
    assert result.content[0].type == "text", result
    return result.content[0].text


def running_process(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("Process running with session ID "):
            return int(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no running process in: {text}")


def test_lists_the_session_tools_as_the_bridge_does(daemon, client, workspace, tmp_path):
    async def body(session: ClientSession):
        return (await session.list_tools()).tools

    tools = run_front(daemon, ["--cwd", str(workspace)], body, tmp_path)
    with client.open_session(workspace, "read-only") as s:
        listed = client.list_tools("chat", session_id=s.id)
    assert [t.name for t in tools] == [t["function"]["name"] for t in listed]
    by_name = {t.name: t for t in tools}
    for t in listed:
        fn = t["function"]
        assert by_name[fn["name"]].input_schema == fn["parameters"]
        assert by_name[fn["name"]].description == fn["description"]
    assert by_name["apply_patch"].input_schema["required"] == ["input"]


def test_calls_tools_keeps_unified_exec_state_and_reports_failures(daemon, workspace, tmp_path):
    (workspace / "notes.txt").write_text("from the host\n")

    async def body(session: ClientSession):
        out = {}
        r = await session.call_tool("exec_command", {"cmd": "echo hello-mcp; cat notes.txt"})
        out["echo"] = (text_of(r), r.is_error)
        r = await session.call_tool(
            "exec_command", {"cmd": "read line; echo got:$line", "tty": True, "yield_time_ms": 300}
        )
        pid = running_process(text_of(r))
        r = await session.call_tool("write_stdin", {"session_id": pid, "chars": "xyz\n", "yield_time_ms": 2000})
        out["stdin"] = (text_of(r), r.is_error)
        r = await session.call_tool("write_stdin", {"session_id": 999999})
        out["unknown_process"] = (text_of(r), r.is_error)
        r = await session.call_tool(
            "apply_patch", {"input": "*** Begin Patch\n*** Add File: added.txt\n+by the sdk\n*** End Patch\n"}
        )
        out["patch"] = (text_of(r), r.is_error)
        with pytest.raises(MCPError) as unknown:
            await session.call_tool("no_such_tool", {})
        out["unknown_tool"] = (unknown.value.code, unknown.value.message)
        return out

    out = run_front(daemon, ["--cwd", str(workspace), "--mode", "workspace-write"], body, tmp_path)
    text, is_error = out["echo"]
    assert not is_error, text
    assert "Process exited with code 0" in text and "hello-mcp" in text and "from the host" in text
    text, is_error = out["stdin"]
    assert not is_error and "got:xyz" in text, text
    assert out["unknown_process"] == ("write_stdin failed: Unknown process id 999999", True)
    text, is_error = out["patch"]
    assert not is_error, text
    assert (workspace / "added.txt").read_text() == "by the sdk\n"
    code, message = out["unknown_tool"]
    assert code == -32602 and "unknown tool: no_such_tool" in message


def test_read_only_session_refuses_writes(daemon, workspace, tmp_path):
    async def body(session: ClientSession):
        r = await session.call_tool(
            "apply_patch", {"input": "*** Begin Patch\n*** Add File: refused.txt\n+x\n*** End Patch\n"}
        )
        return text_of(r), r.is_error

    text, is_error = run_front(daemon, ["--cwd", str(workspace)], body, tmp_path)
    assert is_error, text
    assert not (workspace / "refused.txt").exists()


def test_grpc_errors_are_tool_errors_and_attached_sessions_stay_open(daemon, client, workspace, tmp_path):
    s = client.open_session(workspace, "read-only")

    async def attached(session: ClientSession):
        r = await session.call_tool("exec_command", {"cmd": "echo attached"})
        return text_of(r), r.is_error

    text, is_error = run_front(daemon, ["--session", s.id], attached, tmp_path)
    assert not is_error and "attached" in text, text
    # The front left the session it did not open alone.
    assert "Process exited with code 0" in s.invoke("exec_command", {"cmd": "true"}).output

    async def closed_behind(session: ClientSession):
        client.close_session(s.id)
        r = await session.call_tool("exec_command", {"cmd": "echo gone"})
        return text_of(r), r.is_error

    text, is_error = run_front(daemon, ["--session", s.id], closed_behind, tmp_path)
    assert is_error and text.startswith("NotFound: "), text
