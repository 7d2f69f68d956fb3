"""The OpenAI Agents SDK (openai-agents) with corral, both ways the README shows: ``MCPServerStdio``
running ``corral mcp``, and the session's tools as function tools (``corral_client.agents``).
``Runner.run`` drives an agent whose model is a scripted stand-in for the Responses API on
loopback: its first answer calls corral's tools, its second ends the run. The checks are on the
host (files the sandboxed commands wrote, or could not write) and on what the SDK sent the model.
The README's two recipes also run as written, each in its own process."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import corral_bin, private_dir, remove_private_dir, session_env

# The SDK needs Python 3.10+, so neither venv of run-client-tests.sh has it on 3.9: skipped there
# only. On 3.10+ both venvs install it (the pinned version, and the `agents` extra's floor in the
# lower-bounds venv), and a missing SDK is an error, not a skip.
if sys.version_info < (3, 10):
    pytest.importorskip("agents", reason="openai-agents needs Python 3.10+")

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner  # noqa: E402
from agents.mcp import MCPServerStdio  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from corral_client.agents import function_tools  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"

# A 1×1 PNG, and the data URL the model must get for it.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


class MockResponsesAPI:
    """POST /v1/responses on 127.0.0.1, not streamed: answer ``turns[i]`` (a list of output items)
    to the i-th request, then a final message; every request body is kept in ``requests``."""

    def __init__(self, turns: list[list[dict[str, Any]]], final_text: str = "done"):
        self.turns = turns
        self.final_text = final_text
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                if not self.path.endswith("/responses") or self.headers.get("content-encoding"):
                    mock.errors.append(f"{self.path} {self.headers.get('content-encoding')}")
                    return self._json(400, {"error": {"message": "mock: not a plain /responses request"}})
                body = json.loads(raw)
                mock.requests.append(body)
                n = len(mock.requests) - 1
                if n < len(mock.turns):
                    items = mock.turns[n]
                else:
                    items = [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": mock.final_text, "annotations": []}]}]  # fmt: skip
                self._json(200, response_object(f"resp_{n}", body.get("model", "mock"), items))

            def _json(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def model(self) -> OpenAIResponsesModel:
        client = AsyncOpenAI(base_url=self.base_url, api_key="mock", max_retries=0)
        return OpenAIResponsesModel(model="mock-model", openai_client=client)

    def outputs(self, request: int) -> dict[str, Any]:
        """The function_call_output items of a request, by call id."""
        return {
            i["call_id"]: i["output"] for i in self.requests[request]["input"] if i.get("type") == "function_call_output"
        }

    def tool_names(self, request: int) -> list[str]:
        return [t["name"] for t in self.requests[request].get("tools") or [] if t.get("type") == "function"]


def response_object(rid: str, model: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
            "status": "completed", "output": items, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [], "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
            "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}},
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20}}  # fmt: skip


def function_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}  # fmt: skip


def text_of(output: Any) -> str:
    """A function_call_output's text: a string, or (MCP results) a list of input_text items."""
    if isinstance(output, str):
        return output
    assert all(part.get("type") == "input_text" for part in output), output
    return "".join(part["text"] for part in output)


def the_turn(outside: Path, *, slow: bool) -> list[dict[str, Any]]:
    """One model turn: a command writing in the workspace, one writing outside it, view_image of
    a PNG (and with ``slow``, a command running longer than the SDK's default MCP timeout)."""
    calls = [
        function_call("write", "exec_command", {"cmd": "printf 'written in the sandbox\\n' > made.txt && cat made.txt"}),
        function_call(
            "escape", "exec_command", {"cmd": f"echo x > {outside}/escape.txt && echo ESCAPED || echo DENIED"}
        ),
        function_call("image", "view_image", {"path": "dot.png"}),
    ]
    if slow:
        calls.append(function_call("slow", "exec_command", {"cmd": "sleep 6; echo slept", "yield_time_ms": 15000}))
    return [calls]


def check_the_turn(mock: MockResponsesAPI, workspace: Path, outside: Path, result: Any) -> dict[str, Any]:
    assert not mock.errors, mock.errors
    assert len(mock.requests) == 2, [r.get("input") for r in mock.requests]
    assert result.final_output == "done"
    # The sandboxed command wrote in the workspace, on the host, and its output reached the model.
    assert (workspace / "made.txt").read_text() == "written in the sandbox\n"
    outputs = mock.outputs(1)
    write = text_of(outputs["write"])
    assert "Process exited with code 0" in write and "written in the sandbox" in write, write
    # Outside the workspace: refused by the sandbox, nothing created on the host.
    escape = text_of(outputs["escape"])
    assert "DENIED" in escape and "ESCAPED" not in escape, escape
    assert list(outside.iterdir()) == []
    # view_image: the PNG itself, as an image input.
    assert outputs["image"] == [{"type": "input_image", "image_url": DATA_URL}], outputs["image"]
    return outputs


@pytest.fixture
def outside():
    """A directory outside every writable root of the sessions (not under /tmp, not the workspace)."""
    d = private_dir("corral-pytest-outside-")
    yield d
    remove_private_dir(d)


def tool_names_of(client, workspace: Path, mode: str) -> list[str]:
    with client.open_session(workspace, mode, exclude_slash_tmp=True) as s:
        return [t["function"]["name"] for t in s.list_tools("chat")]


def test_mcp_server_stdio_runs_corral_mcp(daemon, client, workspace, outside):
    (workspace / "dot.png").write_bytes(PNG)
    mock = MockResponsesAPI(the_turn(outside, slow=True))

    async def main():
        # As in the README's recipe: the socket in args (the SDK starts the server with a minimal
        # environment), and a timeout over the SDK's default 5 s, which would cancel "sleep 6".
        params = {
            "command": str(corral_bin()),
            "args": ["mcp", "--socket", daemon.target, "--cwd", str(workspace),
                     "--mode", "workspace-write", "--exclude-slash-tmp"],
        }  # fmt: skip
        async with MCPServerStdio(params=params, name="corral", client_session_timeout_seconds=120) as corral:
            agent = Agent(name="coder", instructions="Use the tools.", model=mock.model(), mcp_servers=[corral])
            return await Runner.run(agent, "Go.", run_config=RunConfig(tracing_disabled=True))

    try:
        result = asyncio.run(main())
    finally:
        mock.close()
    outputs = check_the_turn(mock, workspace, outside, result)
    slow = text_of(outputs["slow"])
    assert "Process exited with code 0" in slow and "slept" in slow, slow
    # The model was offered the workspace-write session's tools, by their names.
    assert mock.tool_names(0) == tool_names_of(client, workspace, "workspace-write")


def test_function_tools_adapter(daemon, client, workspace, outside):
    (workspace / "dot.png").write_bytes(PNG)
    mock = MockResponsesAPI(the_turn(outside, slow=False))
    with client.open_session(workspace, "workspace-write", env=session_env(workspace), exclude_slash_tmp=True) as s:
        tools = function_tools(s)
        assert [t.name for t in tools] == [t["function"]["name"] for t in s.list_tools("chat")]
        agent = Agent(name="coder", instructions="Use the tools.", model=mock.model(), tools=tools)
        try:
            result = asyncio.run(Runner.run(agent, "Go.", run_config=RunConfig(tracing_disabled=True)))
        finally:
            mock.close()
    check_the_turn(mock, workspace, outside, result)
    # The request carried corral's tools with corral's schemas, not made strict.
    offered = {t["name"]: t for t in mock.requests[0]["tools"]}
    with client.open_session(workspace, "workspace-write", exclude_slash_tmp=True) as s:
        for spec in s.list_tools("chat"):
            fn = spec["function"]
            assert offered[fn["name"]]["parameters"] == fn["parameters"], fn["name"]
            assert offered[fn["name"]]["strict"] is False


def readme_recipes() -> list[str]:
    section = README.read_text(encoding="utf-8").split("## OpenAI Agents SDK", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.parametrize("recipe", [0, 1], ids=["mcp", "function_tools"])
def test_the_readme_recipes_work_as_written(daemon, workspace, tmp_path, recipe):
    """Each recipe, as the README has it, in its own process: the only changes are the socket and
    project paths, and the model, which the SDK finds at $OPENAI_BASE_URL."""
    recipes = readme_recipes()
    assert len(recipes) == 2, recipes
    code = recipes[recipe]
    assert "/run/corral/corral.sock" in code or recipe == 1, code
    code = code.replace("/run/corral/corral.sock", daemon.target).replace("/path/to/project", str(workspace))
    mock = MockResponsesAPI([[function_call("c1", "exec_command", {"cmd": "echo recipe > recipe.txt && cat recipe.txt"})]])
    env = {
        "PATH": f"{corral_bin().parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",  # "command": "corral"
        "HOME": str(tmp_path),
        "CORRAL_SOCKET": daemon.target,  # Client(): the default socket
        "OPENAI_BASE_URL": mock.base_url,
        "OPENAI_API_KEY": "mock",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        mock.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n", out.stdout + out.stderr
    assert not mock.errors, mock.errors
    assert len(mock.requests) == 2
    assert (workspace / "recipe.txt").read_text() == "recipe\n"
    output = text_of(mock.outputs(1)["c1"])
    assert "Process exited with code 0" in output and "recipe" in output, output
