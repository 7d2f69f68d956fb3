"""corral-codex-mcp (corral_client.codex_mcp): Codex's `codex` / `codex-reply` MCP tools, end to end.

A real MCP client (the official SDK's stdio_client + ClientSession) launches the server against a
real daemon; the model is a scripted mock of the OpenAI API on 127.0.0.1 that records what it is
sent. Both API shapes, approvals through elicitation, and the error paths."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import unicodedata
import uuid
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import session_env
from corral_client import Client, NotFound, pb
from corral_client.codex_mcp import (
    DEFAULT_INSTRUCTIONS,
    Conversation,
    ToolCallError,
    approval_message,
    parse_codex_arguments,
    parse_reply_arguments,
)

REJECTED = "exec command rejected by user"

# -- the pure parts (no daemon, no mcp) -----------------------------------------------------


def test_codex_arguments_follow_codex_defaults_and_precedence(tmp_path):
    p = parse_codex_arguments({"prompt": "hi"}, str(tmp_path))
    assert (p.prompt, p.cwd, p.sandbox, p.approval_policy) == ("hi", str(tmp_path), None, "on-request")
    assert p.update_plan is None and p.base_instructions is None

    p = parse_codex_arguments(
        {
            "prompt": "x",
            "cwd": "sub/../proj",
            "sandbox": "workspace-write",
            "config": {
                "sandbox_mode": "read-only",  # the tool argument wins
                "approval_policy": "never",
                "sandbox_workspace_write": {"network_access": True, "writable_roots": ["/srv/data"]},
                "sandbox_workspace_write.exclude_slash_tmp": True,
                "project_doc_max_bytes": 0,
                "model_reasoning_effort": "low",
            },
            "include-plan-tool": False,
        },
        "/base",
    )
    assert (p.cwd, p.sandbox, p.approval_policy) == ("/base/proj", "workspace-write", "never")
    assert (p.network_access, p.writable_roots, p.exclude_slash_tmp) == (True, ["/srv/data"], True)
    assert (p.project_doc_max_bytes, p.reasoning_effort, p.update_plan) == (0, "low", False)

    # [sandbox_workspace_write] counts only in that mode, as in Codex.
    config = {"sandbox_workspace_write": {"network_access": True, "writable_roots": ["/srv"]}}
    p = parse_codex_arguments({"prompt": "x", "sandbox": "read-only", "config": config}, "/base")
    assert (p.network_access, p.writable_roots) == (False, [])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (None, "Missing arguments for codex tool-call; the `prompt` field is required."),
        ({}, "Failed to parse configuration for Codex tool: missing field `prompt`"),
        ({"prompt": 3}, "Failed to parse configuration for Codex tool: `prompt` must be a string"),
        ({"prompt": "x", "sandbox": "none"}, "unknown variant `none` of `sandbox`"),
        ({"prompt": "x", "approval-policy": "sometimes"}, "unknown variant `sometimes` of `approval-policy`"),
        ({"prompt": "x", "sandbx": "read-only"}, "unknown field `sandbx`, expected one of"),
        ({"prompt": "x", "config": {"shell_environment_policy.inherit": "all"}}, "unsupported config key"),
        ({"prompt": "x", "config": {"sandbox_workspace_write.network_access": "yes"}}, "must be a boolean"),
        ({"prompt": "x", "config": {"approval_policy": "always"}}, "`approval_policy` must be one of"),
        ({"prompt": "x", "config": []}, "`config` must be an object"),
    ],
)
def test_bad_codex_arguments_are_refused_with_codex_wording(arguments, message):
    with pytest.raises(ToolCallError) as e:
        parse_codex_arguments(arguments, "/")
    assert message in e.value.text
    assert e.value.thread_id is None


def test_reply_takes_thread_id_then_the_deprecated_names():
    tid = str(uuid.uuid4())
    other = str(uuid.uuid4())
    assert parse_reply_arguments({"threadId": tid, "conversationId": other, "prompt": "p"}) == (tid, "p")
    assert parse_reply_arguments({"conversationId": tid.upper(), "prompt": "p"}) == (tid, "p")
    assert parse_reply_arguments({"sessionId": tid, "prompt": "p"}) == (tid, "p")
    with pytest.raises(ToolCallError, match="either threadId or conversationId must be provided"):
        parse_reply_arguments({"prompt": "p"})
    with pytest.raises(ToolCallError, match="Failed to parse thread_id: "):
        parse_reply_arguments({"threadId": "not-a-uuid", "prompt": "p"})


def test_a_failed_turn_leaves_no_tool_call_without_an_output():
    conversation = Conversation.__new__(Conversation)
    conversation.shape = "responses"
    conversation.history = [
        {"type": "message", "role": "user", "content": []},
        {"type": "function_call", "call_id": "a", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "done"},
        {"type": "function_call", "call_id": "b", "name": "exec_command", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": ""},
    ]
    conversation._answer_open_calls(0)
    assert conversation.history[5:] == [
        {"type": "function_call_output", "call_id": "b", "output": "aborted"},
        {"type": "custom_tool_call_output", "call_id": "c", "output": "aborted"},
    ]
    conversation.shape = "chat"
    call = {"id": "t2", "type": "function", "function": {"name": "x", "arguments": "{}"}}
    conversation.history = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    conversation._answer_open_calls(0)
    assert conversation.history[1:] == [{"role": "tool", "tool_call_id": "t2", "content": "aborted"}]


def test_the_server_explains_a_missing_mcp_package(tmp_path):
    """Without the mcp package the command says what to install (simulated: mcp made unimportable)."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "mcp.py").write_text("raise ImportError('blocked for the test')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    proc = subprocess.run(
        [sys.executable, "-m", "corral_client.codex_mcp"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "pip install 'corral-client[mcp]'" in proc.stderr


def hidden_in(text: str) -> list[str]:
    """Characters of ``text`` that would reach the user as themselves but must not (H22): control
    characters other than the message's own paragraph breaks, and the invisible or
    direction-changing ones."""
    invisible = {0x00AD, 0x061C, 0x180E, 0xFEFF, *range(0x200B, 0x2010), *range(0x2028, 0x202F)}
    invisible |= {*range(0x2060, 0x2065), *range(0x2066, 0x206A)}
    return [c for c in text.replace("\n\n", "") if unicodedata.category(c) == "Cc" or ord(c) in invisible]


SPOOF = "touch pwned\r\x1b[2K  $ ls -la"


def test_the_approval_message_shows_hidden_characters_escaped():
    request = pb.ApprovalRequest(
        command=["bash", "-lc", SPOOF],
        cwd="/w\n  in /elsewhere",
        reason="fine\r\x1b[1A\x1b[2Kreason: harmless",
        justification="cleanup of \u202eexe.txt\u202c \u2066ok\u2069 it's \\ fine\n",
    )
    message = approval_message(request)
    assert not hidden_in(message), repr(message)
    assert message == (
        r"Allow Codex to run `bash -lc $'touch pwned\r\x1b[2K  $ ls -la'` in `/w\n  in /elsewhere`?"
        "\n\n"
        r"fine\r\x1b[1A\x1b[2Kreason: harmless"
        "\n\n"
        r"The model says: cleanup of \u202eexe.txt\u202c \u2066ok\u2069 it's \ fine\n"
    )
    # No reason or justification: no paragraph for them; plain commands read as before.
    plain = approval_message(pb.ApprovalRequest(command=["bash", "-lc", "touch a.txt"], cwd="/w"))
    assert plain == "Allow Codex to run `bash -lc 'touch a.txt'` in `/w`?"
    # Long text is cut with a note, field by field.
    long = approval_message(
        pb.ApprovalRequest(command=["echo", "y" * 5000], cwd="/w", reason="z" * 5000, justification="j" * 3000)
    )
    assert long.count("more characters not shown") == 3 and len(long) < 6300, len(long)


# -- end to end -----------------------------------------------------------------------------

mcp = pytest.importorskip(
    "mcp", reason="the mcp package needs Python 3.10+ (run-client-tests.sh installs it there)"
)

import anyio  # noqa: E402  (an mcp dependency)
import mcp_types as types  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402


class Gated:
    """A scripted answer sent only once ``gate`` is set (the test decides when the model answers)."""

    def __init__(self, answer: Any):
        self.answer = answer
        self.gate = threading.Event()


class MockModel:
    """The OpenAI API on 127.0.0.1, scripted: each POST gets the next answer of the script (a
    JSON object, ``(status, body)`` or :class:`Gated`); every request is recorded as (path,
    headers, body)."""

    def __init__(self, script: list[Any]):
        self.script = list(script)
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                mock.requests.append((self.path, dict(self.headers), body))
                answer = (
                    mock.script.pop(0) if mock.script else (500, {"error": {"message": "script exhausted"}})
                )
                if isinstance(answer, Gated):
                    assert answer.gate.wait(60), "the test never opened the gate"
                    answer = answer.answer
                status, answer = answer if isinstance(answer, tuple) else (200, answer)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, _, body in self.requests]


@pytest.fixture
def model():
    mocks: list[MockModel] = []

    def make(script: list[Any]) -> MockModel:
        mocks.append(MockModel(script))
        return mocks[-1]

    yield make
    for m in mocks:
        m.close()


# Responses API answers.
def response(*items: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"resp_{uuid.uuid4().hex[:8]}",
        "object": "response",
        "status": "completed",
        "output": list(items),
    }


def function_call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def custom_call(name: str, input: str, call_id: str) -> dict[str, Any]:
    return {
        "type": "custom_tool_call",
        "id": f"ctc_{call_id}",
        "call_id": call_id,
        "name": name,
        "input": input,
    }


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex[:8]}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


# Chat Completions answers.
def completion(content: str | None, *tool_calls: dict[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = list(tool_calls)
    reason = "tool_calls" if tool_calls else "stop"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": msg, "finish_reason": reason}],
    }


def chat_call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def user_text(item: dict[str, Any]) -> str:
    """The text of a user message in either shape."""
    content = item["content"]
    return content if isinstance(content, str) else content[0]["text"]


PATCH = "*** Begin Patch\n*** Update File: out.txt\n@@\n hello\n+world\n*** End Patch\n"


def run_server(
    daemon,
    mock: MockModel,
    body: Callable[[ClientSession], Awaitable[Any]],
    tmp_path: Path,
    *,
    api: str = "responses",
    args: tuple[str, ...] = (),
    elicitation_callback: Any = None,
    cwd: Path | None = None,
) -> Any:
    """Launches `python -m corral_client.codex_mcp` over stdio with the SDK's client, initializes,
    runs `body`, and shuts the server down the SDK's way (stdin closed)."""
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "corral_client.codex_mcp",
            "--socket",
            daemon.target,
            "--api",
            api,
            "--base-url",
            mock.url,
            "--model",
            "test-model",
            "--verbose",
            *args,
        ],
        env={
            **session_env(tmp_path),
            "OPENAI_API_KEY": "test-key",
            "CORRAL_MODEL_API": "",
            "OPENAI_MODEL": "",
        },
        cwd=str(cwd or tmp_path),
    )
    errlog_path = tmp_path / "codex-mcp.stderr"

    async def main() -> Any:
        with open(errlog_path, "w") as errlog, anyio.fail_after(120):
            async with stdio_client(server, errlog=errlog) as (read, write):
                async with ClientSession(read, write, elicitation_callback=elicitation_callback) as session:
                    init = await session.initialize()
                    assert init.server_info.name == "corral-codex-mcp"
                    return await body(session)

    try:
        return anyio.run(main)
    except BaseException:
        print("corral-codex-mcp stderr:\n" + errlog_path.read_text(errors="replace"))
        raise


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1 and result.content[0].type == "text", result
    return result.content[0].text


def session_id_of(result: types.CallToolResult) -> str:
    return (result.meta or {})["corral/sessionId"]


def test_tools_list_is_codexs_schema(daemon, model, tmp_path):
    mock = model([])

    async def body(session: ClientSession):
        return (await session.list_tools()).tools

    tools = {t.name: t for t in run_server(daemon, mock, body, tmp_path)}
    assert sorted(tools) == ["codex", "codex-reply"]
    codex, reply = tools["codex"], tools["codex-reply"]
    assert (codex.title, reply.title) == ("Codex", "Codex Reply")
    assert (
        codex.description
        == "Run a Codex session. Accepts configuration parameters matching the Codex Config struct."
    )
    assert reply.description == "Continue a Codex conversation by providing the thread id and prompt."
    props = codex.input_schema["properties"]
    assert sorted(props) == [
        "approval-policy",
        "base-instructions",
        "compact-prompt",
        "config",
        "cwd",
        "developer-instructions",
        "model",
        "profile",
        "prompt",
        "sandbox",
    ]
    assert props["approval-policy"]["enum"] == ["untrusted", "on-failure", "on-request", "never"]
    assert props["sandbox"]["enum"] == ["read-only", "workspace-write", "danger-full-access"]
    assert props["config"] == {
        "additionalProperties": True,
        "description": "Individual config settings that will override what is in CODEX_HOME/config.toml.",
        "type": "object",
    }
    assert codex.input_schema["required"] == ["prompt"] and reply.input_schema["required"] == ["prompt"]
    assert sorted(reply.input_schema["properties"]) == ["conversationId", "prompt", "threadId"]
    for tool in (codex, reply):
        assert tool.output_schema == {
            "type": "object",
            "properties": {"threadId": {"type": "string"}, "content": {"type": "string"}},
            "required": ["threadId", "content"],
        }
    assert mock.requests == []


def test_codex_then_codex_reply_finish_a_task_with_the_responses_api(daemon, model, workspace, tmp_path):
    (workspace / "AGENTS.md").write_text("Always greet.\n")
    mock = model(
        [
            response(function_call("exec_command", {"cmd": "printf 'hello\\n' > out.txt"}, "call_1")),
            response(message("wrote out.txt")),
            response(custom_call("apply_patch", PATCH, "call_2")),
            response(message("patched")),
        ]
    )

    async def body(session: ClientSession):
        first = await session.call_tool(
            "codex",
            {
                "prompt": "write hello",
                "cwd": str(workspace),
                "sandbox": "workspace-write",
                "approval-policy": "never",
                "base-instructions": "BASE PROMPT",
                "developer-instructions": "DEV NOTE",
            },
        )
        assert not first.is_error, first
        second = await session.call_tool(
            "codex-reply", {"threadId": first.structured_content["threadId"], "prompt": "now add world"}
        )
        return first, second

    first, second = run_server(daemon, mock, body, tmp_path)
    thread_id = first.structured_content["threadId"]
    assert str(uuid.UUID(thread_id)) == thread_id
    assert (text_of(first), first.structured_content) == (
        "wrote out.txt",
        {"threadId": thread_id, "content": "wrote out.txt"},
    )
    assert (text_of(second), second.structured_content) == (
        "patched",
        {"threadId": thread_id, "content": "patched"},
    )
    assert not second.is_error
    assert (workspace / "out.txt").read_text() == "hello\nworld\n"

    assert [path for path, _, _ in mock.requests] == ["/v1/responses"] * 4
    assert all(h["Authorization"] == "Bearer test-key" for _, h, _ in mock.requests)
    r1, r2, r3, r4 = mock.bodies()
    assert r1["model"] == "test-model" and r1["instructions"] == "BASE PROMPT"
    assert {t.get("name") for t in r1["tools"]} >= {
        "exec_command",
        "write_stdin",
        "apply_patch",
        "update_plan",
    }
    # Codex's order: the developer message, AGENTS.md, the environment context, then the prompt.
    developer, agents, env_context, prompt = r1["input"]
    assert developer == {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "DEV NOTE"}],
    }
    assert user_text(agents).startswith(
        f"# AGENTS.md instructions for {workspace}"
    ) and "Always greet." in user_text(agents)
    assert user_text(env_context).startswith(
        "<environment_context>"
    ) and f"<cwd>{workspace}</cwd>" in user_text(env_context)
    assert prompt == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "write hello"}],
    }
    # The tool's output went back to the model, after the whole conversation so far.
    assert r2["input"][:5] == r1["input"] + [
        function_call("exec_command", {"cmd": "printf 'hello\\n' > out.txt"}, "call_1")
    ]
    output = r2["input"][5]
    assert output["type"] == "function_call_output" and output["call_id"] == "call_1"
    assert "Process exited with code 0" in output["output"]
    # codex-reply continued the same conversation.
    assert r3["input"][:6] == r2["input"] and r3["input"][6]["role"] == "assistant"
    assert r3["input"][7] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "now add world"}],
    }
    patched = r4["input"][-1]
    assert patched["type"] == "custom_tool_call_output" and patched["call_id"] == "call_2"
    assert "out.txt" in patched["output"]
    # The server closed its session when the client went away.
    with Client(daemon.target, timeout=30) as client, pytest.raises(NotFound):
        client.close_session(session_id_of(first))


def test_codex_then_codex_reply_with_chat_completions_and_the_default_prompt(
    daemon, model, workspace, tmp_path
):
    mock = model(
        [
            completion(None, chat_call("exec_command", {"cmd": "printf 'hello\\n' > out.txt && env"}, "t1")),
            completion("wrote it"),
            completion(None, chat_call("apply_patch", {"input": PATCH}, "t2")),
            completion("done"),
        ]
    )

    async def body(session: ClientSession):
        first = await session.call_tool(
            "codex", {"prompt": "write hello", "sandbox": "workspace-write", "model": "other-model"}
        )
        # The deprecated id name still works.
        second = await session.call_tool(
            "codex-reply", {"conversationId": first.structured_content["threadId"], "prompt": "add world"}
        )
        return first, second

    # No cwd argument: the server's own directory.
    first, second = run_server(daemon, mock, body, tmp_path, api="chat", cwd=workspace)
    assert (text_of(first), text_of(second)) == ("wrote it", "done"), (first, second)
    assert second.structured_content["threadId"] == first.structured_content["threadId"]
    assert (workspace / "out.txt").read_text() == "hello\nworld\n"

    assert [path for path, _, _ in mock.requests] == ["/v1/chat/completions"] * 4
    r1, r2, r3, r4 = mock.bodies()
    assert {b["model"] for b in (r1, r2, r3, r4)} == {"other-model"}
    system, env_context, prompt = r1["messages"]  # no AGENTS.md here: no such message
    assert system == {"role": "system", "content": DEFAULT_INSTRUCTIONS}
    assert user_text(env_context).startswith("<environment_context>") and str(workspace) in user_text(
        env_context
    )
    assert prompt == {"role": "user", "content": "write hello"}
    assert all(t["type"] == "function" for t in r1["tools"])
    assistant, tool = r2["messages"][3:]
    assert (
        assistant["tool_calls"][0]["id"] == "t1" and tool["role"] == "tool" and tool["tool_call_id"] == "t1"
    )
    assert "Process exited with code 0" in tool["content"]
    # Commands get the server's core variables, never the model API key.
    assert f"HOME={tmp_path}\n" in tool["content"] and "test-key" not in tool["content"]
    assert r3["messages"][:5] == r2["messages"] and r3["messages"][-1] == {
        "role": "user",
        "content": "add world",
    }
    assert r4["messages"][-1]["tool_call_id"] == "t2" and "out.txt" in r4["messages"][-1]["content"]


def test_unknown_thread_and_bad_arguments_are_errors_and_nothing_runs(daemon, model, workspace, tmp_path):
    mock = model([])
    unknown = str(uuid.uuid4())

    async def body(session: ClientSession):
        calls = [
            ("codex-reply", {"threadId": unknown, "prompt": "rm -rf everything"}),
            ("codex-reply", {"prompt": "no id"}),
            ("codex-reply", {"threadId": "../etc", "prompt": "bad id"}),
            ("codex", {"prompt": "x", "sandbox": "everything"}),
            ("codex", {"prompt": "x", "config": {"shell_environment_policy.inherit": "all"}}),
            ("codex", {"prompt": "x", "cwd": str(workspace / "missing")}),
            ("codex", {"prompt": "x", "profile": "no-such-profile"}),
            ("no-such-tool", {}),
        ]
        return [await session.call_tool(name, args) for name, args in calls]

    results = run_server(daemon, mock, body, tmp_path)
    assert all(r.is_error for r in results), results
    not_found = results[0]
    assert text_of(not_found) == f"Session not found for thread_id: {unknown}"
    assert not_found.structured_content == {"threadId": unknown, "content": text_of(not_found)}
    assert (
        text_of(results[1]) == "Failed to parse thread_id: either threadId or conversationId must be provided"
    )
    assert text_of(results[2]).startswith("Failed to parse thread_id: ")
    assert "unknown variant `everything` of `sandbox`" in text_of(results[3])
    assert "unsupported config key `shell_environment_policy.inherit`" in text_of(results[4])
    assert text_of(results[5]).startswith("Failed to start Codex session: ")
    assert text_of(results[6]).startswith("Failed to start Codex session: ") and "no-such-profile" in text_of(
        results[6]
    )
    assert text_of(results[7]) == "Unknown tool 'no-such-tool'"
    assert all(r.structured_content is None for r in results[1:])
    assert mock.requests == []


def test_sigterm_closes_the_sessions(daemon, model, workspace, tmp_path):
    """A server stopped by a signal (not by its client closing stdin) closes its sessions too.
    MCP spoken by hand here: newline-delimited JSON-RPC on the server's stdin and stdout."""
    mock = model([response(message("ok"))])
    env = {**session_env(tmp_path), "OPENAI_API_KEY": "k"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral_client.codex_mcp", "--socket", daemon.target, "--base-url", mock.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:

        def send(message: dict[str, Any]) -> None:
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
            proc.stdin.flush()

        send(
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                },
            }
        )
        assert json.loads(proc.stdout.readline())["id"] == 1
        send({"method": "notifications/initialized"})
        send(
            {
                "id": 2,
                "method": "tools/call",
                "params": {"name": "codex", "arguments": {"prompt": "p", "cwd": str(workspace)}},
            }
        )
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == 2 and answer["result"]["structuredContent"]["content"] == "ok", answer
        session_id = answer["result"]["_meta"]["corral/sessionId"]
        with Client(daemon.target, timeout=30) as client:
            client.session(session_id).list_tools()  # open while the server runs
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            with pytest.raises(NotFound):
                client.close_session(session_id)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_turn_limit_and_model_errors_keep_the_thread(daemon, model, workspace, tmp_path):
    mock = model(
        [
            response(function_call("exec_command", {"cmd": "true"}, "c1")),
            response(function_call("exec_command", {"cmd": "true"}, "c2")),
            (500, {"error": {"message": "the model is overloaded"}}),
            response(message("recovered")),
        ]
    )

    async def body(session: ClientSession):
        first = await session.call_tool("codex", {"prompt": "loop", "cwd": str(workspace)})
        thread = {"threadId": first.structured_content["threadId"]}
        second = await session.call_tool("codex-reply", {**thread, "prompt": "again"})
        third = await session.call_tool("codex-reply", {**thread, "prompt": "once more"})
        return first, second, third

    first, second, third = run_server(daemon, mock, body, tmp_path, args=("--max-turns", "2"))
    assert first.is_error and "--max-turns" in text_of(first), first
    assert second.is_error and "HTTP 500" in text_of(second) and "the model is overloaded" in text_of(second)
    assert not third.is_error and text_of(third) == "recovered"
    assert {first.structured_content["threadId"], third.structured_content["threadId"]} == {
        second.structured_content["threadId"]
    }
    last = mock.bodies()[-1]["input"]
    assert [user_text(i) for i in last if i.get("role") == "user"][-3:] == ["loop", "again", "once more"]
    outputs = [i for i in last if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["c1", "c2"]


def test_a_cancelled_call_stops_its_turn_before_the_next_tool_call(daemon, model, workspace, tmp_path):
    slow = Gated(response(function_call("exec_command", {"cmd": "touch cancelled.txt"}, "c1")))
    mock = model([response(message("first")), slow, response(message("after"))])

    async def body(session: ClientSession):
        first = await session.call_tool(
            "codex", {"prompt": "start", "cwd": str(workspace), "sandbox": "workspace-write"}
        )
        thread = {"threadId": first.structured_content["threadId"]}
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.call_tool, "codex-reply", {**thread, "prompt": "slow"})
            while len(mock.requests) < 2:  # the model has the request: cancel the call now
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        # The cancelled turn still waits for the model: the thread is busy, nothing else runs.
        busy = await session.call_tool("codex-reply", {**thread, "prompt": "too early"})
        slow.gate.set()
        for _ in range(500):  # until the cancelled turn has stopped
            after = await session.call_tool("codex-reply", {**thread, "prompt": "after"})
            if not (after.is_error and "is busy" in text_of(after)):
                break
            await anyio.sleep(0.02)
        return busy, after

    busy, after = run_server(daemon, mock, body, tmp_path)
    assert busy.is_error and "is busy" in text_of(busy), busy
    assert not after.is_error and text_of(after) == "after", after
    assert not (workspace / "cancelled.txt").exists()  # the tool call after the cancel never ran
    assert len(mock.requests) == 3
    last = mock.bodies()[-1]["input"]
    assert {"type": "function_call_output", "call_id": "c1", "output": "aborted"} in last
    assert [user_text(i) for i in last if i.get("role") == "user"][-3:] == ["start", "slow", "after"]


def test_approvals_are_asked_through_elicitation(daemon, model, workspace, tmp_path):
    mock = model(
        [
            response(function_call("exec_command", {"cmd": "touch approved.txt"}, "c1")),
            response(message("approved one")),
            response(function_call("exec_command", {"cmd": "touch declined.txt"}, "c2")),
            response(message("declined one")),
        ]
    )
    asked: list[types.ElicitRequestFormParams] = []
    answers = [types.ElicitResult(action="accept"), types.ElicitResult(action="decline")]

    async def on_elicit(context, params):
        asked.append(params)
        return answers[len(asked) - 1]

    async def body(session: ClientSession):
        first = await session.call_tool(
            "codex",
            {
                "prompt": "touch",
                "cwd": str(workspace),
                "sandbox": "workspace-write",
                "approval-policy": "untrusted",
            },
        )
        second = await session.call_tool(
            "codex-reply", {"threadId": first.structured_content["threadId"], "prompt": "touch another"}
        )
        return first, second

    first, second = run_server(daemon, mock, body, tmp_path, elicitation_callback=on_elicit)
    assert (text_of(first), text_of(second)) == ("approved one", "declined one")
    assert (workspace / "approved.txt").exists()
    assert not (workspace / "declined.txt").exists()
    assert len(asked) == 2
    thread_id = first.structured_content["threadId"]
    for params, cmd, call_id in zip(asked, ("touch approved.txt", "touch declined.txt"), ("c1", "c2")):
        assert params.message.startswith("Allow Codex to run `") and cmd in params.message
        assert f"in `{workspace}`?" in params.message
        assert params.requested_schema["type"] == "object"
        assert params.meta["threadId"] == thread_id and params.meta["codex_call_id"] == call_id
        assert params.meta["codex_elicitation"] == "exec-approval"
    outputs = [i for i in mock.bodies()[-1]["input"] if i.get("type") == "function_call_output"]
    assert "Process exited with code 0" in outputs[0]["output"]
    assert outputs[1]["output"] == REJECTED


def test_an_elicitation_shows_a_spoofed_command_escaped(daemon, model, workspace, tmp_path):
    """The red team's spoof (A02) through the whole front: the host's dialog gets the command with
    CR and the escape sequence written out, the justification's direction override escaped;
    ``_meta`` keeps the raw argv for the host's own use."""
    justification = "tidy up \u202etxt.exe\u202c"
    mock = model(
        [
            response(function_call("exec_command", {"cmd": SPOOF, "justification": justification}, "c1")),
            response(message("refused")),
        ]
    )
    asked: list[types.ElicitRequestFormParams] = []

    async def on_elicit(context, params):
        asked.append(params)
        return types.ElicitResult(action="decline")

    async def body(session: ClientSession):
        return await session.call_tool(
            "codex",
            {"prompt": "p", "cwd": str(workspace), "sandbox": "workspace-write", "approval-policy": "untrusted"},
        )

    result = run_server(daemon, mock, body, tmp_path, elicitation_callback=on_elicit)
    assert text_of(result) == "refused", result
    assert not (workspace / "pwned").exists()
    assert len(asked) == 1
    shown = asked[0].message
    assert not hidden_in(shown), repr(shown)
    assert r"$'touch pwned\r\x1b[2K  $ ls -la'" in shown, shown
    assert r"The model says: tidy up \u202etxt.exe\u202c" in shown, shown
    assert asked[0].meta["codex_command"][-1] == SPOOF  # data, not display: raw


def test_an_approval_for_session_is_asked_once(daemon, model, workspace, tmp_path):
    touch = {"cmd": "touch again.txt"}
    mock = model(
        [
            response(function_call("exec_command", touch, "c1")),
            response(function_call("exec_command", touch, "c2")),
            response(message("twice")),
        ]
    )
    asked = []

    async def on_elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "approved_for_session"})

    async def body(session: ClientSession):
        return await session.call_tool(
            "codex",
            {
                "prompt": "p",
                "cwd": str(workspace),
                "sandbox": "workspace-write",
                "approval-policy": "untrusted",
            },
        )

    result = run_server(daemon, mock, body, tmp_path, elicitation_callback=on_elicit)
    assert text_of(result) == "twice", result
    assert len(asked) == 1
    outputs = [i for i in mock.bodies()[-1]["input"] if i.get("type") == "function_call_output"]
    assert all("Process exited with code 0" in o["output"] for o in outputs) and len(outputs) == 2


def test_without_elicitation_approvals_are_denied(daemon, model, workspace, tmp_path):
    mock = model(
        [
            response(function_call("exec_command", {"cmd": "touch never.txt"}, "c1")),
            response(message("it was refused")),
        ]
    )

    async def body(session: ClientSession):
        return await session.call_tool(
            "codex",
            {
                "prompt": "p",
                "cwd": str(workspace),
                "sandbox": "workspace-write",
                "approval-policy": "untrusted",
            },
        )

    result = run_server(daemon, mock, body, tmp_path)  # the client declares no elicitation
    assert text_of(result) == "it was refused", result
    assert not (workspace / "never.txt").exists()
    output = mock.bodies()[-1]["input"][-1]
    assert output == {"type": "function_call_output", "call_id": "c1", "output": REJECTED}
