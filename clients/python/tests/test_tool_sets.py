"""A session's tool set through the client and both adapters: the open_session options,
exec_command/write_stdin (sharing the process table with session.processes), update_plan,
view_image's content items, and messages beyond gRPC's default 4 MiB."""

from __future__ import annotations

import base64
import json
import re

import pytest
from conftest import populate, session_env
from corral_client import (
    MAX_MESSAGE_BYTES,
    ChatCompletionsAdapter,
    Client,
    ResourceExhausted,
    ResponsesAdapter,
)

NO_IMAGES = "view_image is not allowed because you do not support image inputs"

# A 1×1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def names(tools):
    return [t.get("name") or t["function"]["name"] for t in tools]


def call(name, arguments, call_id="c"):
    return {"type": "function_call", "name": name, "arguments": json.dumps(arguments), "call_id": call_id}


def chat_call(name, arguments, call_id="c"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_open_session_takes_every_tool_set_option(client, workspace):
    env = session_env(workspace)
    with client.open_session(workspace, "read-only", env=env) as s:
        default = names(s.list_tools())
    assert default[:2] == ["exec_command", "write_stdin"]
    assert {"update_plan", "view_image", "apply_patch"} <= set(default)
    with client.open_session(
        workspace,
        "read-only",
        env=env,
        shell_tool="shell_command",
        apply_patch_tool="function",
        update_plan=False,
        view_image=False,
    ) as s:
        want = ["shell_command", "read_file", "list_dir", "grep_files", "apply_patch"]
        assert names(s.list_tools()) == want
        assert s.list_tools()[-1]["type"] == "function"
        assert s.invoke("view_image", {"path": "x.png"}).output == "unsupported call: view_image"
    with client.open_session(workspace, "read-only", shell_tool="none", apply_patch_tool="none") as s:
        assert names(s.list_tools()) == ["read_file", "list_dir", "grep_files", "update_plan", "view_image"]
    (workspace / "dot.png").write_bytes(PNG)
    with client.open_session(workspace, "read-only", no_image_input=True) as s:
        r = s.invoke("view_image", {"path": "dot.png"})
        assert (r.output, r.success) == (NO_IMAGES, False)
        assert not r.content_items
    with pytest.raises(ValueError):
        client.open_session(workspace, "read-only", shell_tool="zsh")


def test_view_image_through_both_adapters(client, workspace):
    (workspace / "dot.png").write_bytes(PNG)
    with client.open_session(workspace, "read-only") as s:
        out = ResponsesAdapter(s).handle(call("view_image", {"path": "dot.png"}, "v1"))
        assert out == {
            "type": "function_call_output",
            "call_id": "v1",
            "output": [{"type": "input_image", "image_url": DATA_URL}],
        }
        out = ResponsesAdapter(s).handle(call("view_image", {"path": "dot.png", "detail": "original"}, "v2"))
        assert out["output"] == [{"type": "input_image", "image_url": DATA_URL, "detail": "original"}]
        # Chat Completions: the image as a content part of the tool message, as Codex sends it.
        msg = ChatCompletionsAdapter(s).handle(chat_call("view_image", {"path": "dot.png"}, "v3"))
        assert msg == {
            "role": "tool",
            "tool_call_id": "v3",
            "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}],
        }
        # A failure is text in both.
        bad = call("view_image", {"path": "missing.png"}, "v4")
        assert ResponsesAdapter(s).handle(bad)["output"].startswith("unable to locate image at")
        assert ChatCompletionsAdapter(s).handle(chat_call("view_image", {"path": "missing.png"}))[
            "content"
        ].startswith("unable to locate image at")


def test_update_plan_through_both_adapters(client, workspace):
    plan = {
        "explanation": "go",
        "plan": [{"step": "read", "status": "completed"}, {"step": "fix", "status": "in_progress"}],
    }
    with client.open_session(workspace, "read-only") as s:
        assert ResponsesAdapter(s).handle(call("update_plan", plan))["output"] == "Plan updated"
        assert ChatCompletionsAdapter(s).handle(chat_call("update_plan", plan))["content"] == "Plan updated"


def test_exec_command_and_write_stdin_share_the_process_table(client, workspace):
    with client.open_session(workspace, "workspace-write", env=session_env(workspace)) as s:
        adapter = ResponsesAdapter(s)
        exec_args = {"cmd": "cat", "tty": True, "yield_time_ms": 300}
        out = adapter.handle(call("exec_command", exec_args, "e1"))["output"]
        pid = int(re.search(r"Process running with session ID (\d+)", out).group(1))
        # The model's process is one of the session's processes...
        [info] = s.processes.list()
        assert info.id == pid and info.tty
        proc = s.processes.attach(pid)
        proc.write("from-the-api\n")
        # ...and write_stdin (here through the Chat Completions adapter) sees what the API wrote.
        msg = ChatCompletionsAdapter(s).handle(
            chat_call("write_stdin", {"session_id": pid, "chars": "ping\n", "yield_time_ms": 300})
        )
        assert "from-the-api" in msg["content"] and "ping" in msg["content"], msg
        # A process started here is reachable by write_stdin.
        started = s.processes.start(["cat"], tty=True)
        pong = {"session_id": started.id, "chars": "pong\n", "yield_time_ms": 300}
        out = adapter.handle(call("write_stdin", pong))["output"]
        assert "pong" in out
        assert sorted(p.id for p in s.processes.list()) == sorted([pid, started.id])
        proc.terminate()
        started.terminate()


def test_messages_beyond_four_mib(daemon, client, workspace):
    """A read_file answer of ~17 MB: over gRPC's default 4 MiB receive limit, within the
    client's 64 MiB."""
    line = "x" * 400
    populate(workspace, {"big.txt": (line + "\n") * 20_000})
    with client.open_session(workspace, "read-only") as s:
        r = s.read_file("big.txt", limit=20_000)
        assert len(r.lines) == 20_000 and r.ByteSize() > 4 * 1024 * 1024
        assert MAX_MESSAGE_BYTES == 64 * 1024 * 1024
        # With gRPC's default limit the same answer is refused.
        default_limit = [("grpc.max_receive_message_length", 4 * 1024 * 1024)]
        with Client(daemon.target, timeout=60, options=default_limit) as small:
            with pytest.raises(ResourceExhausted):
                small.read_file(s.id, "big.txt", limit=20_000)
