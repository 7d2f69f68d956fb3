"""An agent loop never crashes on a tool result: errors the model's call caused (a result too large
for one response or for this client's receive limit, bad arguments) reach the model as text, through
both adapters; errors of the connection still raise. Against a real daemon."""

from __future__ import annotations

import json

import pytest
from conftest import Daemon
from corral_client import ChatCompletionsAdapter, Client, ResponsesAdapter, Unavailable

ASK_FOR_LESS = "ask for less (read_file: offset and limit"


def _big_file(path, size: int) -> None:
    """`size` bytes of 100-byte lines (under read_file's line-length cut)."""
    line = b"x" * 99 + b"\n"
    with open(path, "wb") as f:
        for _ in range(size // len(line) + 1):
            f.write(line)


def _read_all(name: str = "big.txt") -> str:
    return json.dumps({"file_path": name, "offset": 1, "limit": 100_000_000})


def _function_call(name: str, arguments: str, call_id: str = "c1") -> dict:
    return {"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id}


def _chat_call(name: str, arguments: str, call_id: str = "t1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_result_over_32_mib_is_model_text_through_both_adapters(client, workspace):
    # The model asks read_file for everything of a 40 MiB file: more than one response may carry.
    _big_file(workspace / "big.txt", 40 << 20)
    with client.open_session(workspace) as s:
        out = ResponsesAdapter(s).handle(_function_call("read_file", _read_all()))
        assert out["type"] == "function_call_output" and out["call_id"] == "c1"
        assert ASK_FOR_LESS in out["output"], out["output"][:500]
        assert len(out["output"]) < 4096
        msg = ChatCompletionsAdapter(s).handle(_chat_call("read_file", _read_all()))
        assert msg["role"] == "tool" and msg["tool_call_id"] == "t1"
        assert ASK_FOR_LESS in msg["content"], msg["content"][:500]
        # The loop goes on: the model asks for less and gets it.
        less = ResponsesAdapter(s).handle(
            _function_call("read_file", json.dumps({"file_path": "big.txt", "offset": 1, "limit": 2}), "c2")
        )
        assert less["output"] == "L1: " + "x" * 99 + "\nL2: " + "x" * 99


def test_a_result_over_the_clients_receive_limit_is_model_text(daemon, workspace):
    # Under the daemon's 32 MiB, over this client's 1 MiB receive limit: gRPC's own
    # RESOURCE_EXHAUSTED, raised by the client library, not sent by the daemon.
    _big_file(workspace / "big.txt", 2 << 20)
    with Client(daemon.target, timeout=60, options=[("grpc.max_receive_message_length", 1 << 20)]) as c:
        with c.open_session(workspace) as s:
            out = ResponsesAdapter(s).handle(_function_call("read_file", _read_all()))
            assert out["output"].startswith("the result is too large to receive ("), out["output"]
            assert ASK_FOR_LESS in out["output"]
            msg = ChatCompletionsAdapter(s).handle(_chat_call("read_file", _read_all()))
            assert msg["content"] == out["output"]


def test_invalid_arguments_of_the_model_are_model_text(client, workspace):
    # A tool call with an empty name: the daemon answers INVALID_ARGUMENT.
    with client.open_session(workspace) as s:
        out = ResponsesAdapter(s).handle(_function_call("", "{}"))
        assert out["output"] == "name is required: the tool the model called", out
        msg = ChatCompletionsAdapter(s).handle(_chat_call("", "{}"))
        assert msg == {"role": "tool", "tool_call_id": "t1", "content": "name is required: the tool the model called"}


def test_connection_errors_still_raise(workspace):
    d = Daemon()
    try:
        with Client(d.target, timeout=10) as c:
            s = c.open_session(workspace)
            d.stop()
            with pytest.raises(Unavailable):
                ResponsesAdapter(s).handle(_function_call("list_dir", '{"dir_path":"."}'))
            with pytest.raises(Unavailable):
                ChatCompletionsAdapter(s).handle(_chat_call("list_dir", '{"dir_path":"."}'))
    finally:
        d.stop()
