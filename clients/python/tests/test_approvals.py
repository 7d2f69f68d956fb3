"""Approval policies from the Python client: the adapters' ``on_approval`` (default: deny), the
sync and async ``decide_approval`` and ``classify_command``, against a real daemon that allows
escalation (so a retry without the sandbox can be approved)."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import Daemon, private_dir, remove_private_dir, session_env
from corral_client import ChatCompletionsAdapter, Client, FailedPrecondition, NotFound, ResponsesAdapter, pb
from corral_client.aio import AsyncClient

REJECTED = "exec command rejected by user"


@pytest.fixture(scope="module")
def escalating():
    d = Daemon(extra=("--allow-escalation", "--root-callers", "trusted"))
    yield d
    d.stop()


@pytest.fixture
def outside():
    """A directory outside every writable root (not under /tmp, nor in the checkout, which may be
    there)."""
    d = private_dir("corral-pytest-outside-")
    yield d
    remove_private_dir(d)


def call(name: str, args: dict, call_id: str = "c1") -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(args), "call_id": call_id}


def test_responses_adapter_approves_a_retry_and_the_output_reaches_the_model(escalating, workspace, outside):
    target = outside / "report.txt"
    asked: list[pb.ApprovalRequest] = []

    def on_approval(request: pb.ApprovalRequest) -> str:
        asked.append(request)
        return "approved"

    with Client(escalating.target, timeout=60) as client:
        with client.open_session(
            workspace, "workspace-write", env=session_env(workspace), approval_policy="on-failure"
        ) as s:
            script = f"echo escaped > {target} && cat {target}"
            out = ResponsesAdapter(s, on_approval=on_approval).handle(
                call("shell", {"command": ["bash", "-c", script]})
            )
    assert len(asked) == 1
    assert asked[0].kind == pb.APPROVAL_KIND_RETRY_UNSANDBOXED
    assert asked[0].reason == "command failed; retry without sandbox?"
    assert list(asked[0].command) == ["bash", "-c", script]
    assert out["type"] == "function_call_output" and out["call_id"] == "c1"
    assert json.loads(out["output"])["output"] == "escaped\n"
    assert target.read_text() == "escaped\n"


def test_without_on_approval_the_adapters_deny_and_nothing_runs(daemon, workspace):
    (workspace / "x").write_text("keep")
    with Client(daemon.target, timeout=60) as client:
        with client.open_session(
            workspace, "workspace-write", env=session_env(workspace), approval_policy="untrusted"
        ) as s:
            responses = ResponsesAdapter(s)
            assert "x" in responses.handle(call("shell", {"command": ["ls"]}))["output"], "ls runs at once"
            out = responses.handle(call("shell", {"command": ["rm", "x"]}))
            assert out == {"type": "function_call_output", "call_id": "c1", "output": REJECTED}
            tc = {"id": "t1", "type": "function", "function": {"name": "shell", "arguments": '{"command":["rm","x"]}'}}
            assert ChatCompletionsAdapter(s).handle(tc) == {"role": "tool", "tool_call_id": "t1", "content": REJECTED}
    assert (workspace / "x").read_text() == "keep"


def test_chat_adapter_approved_for_session_is_asked_once(daemon, workspace):
    asked: list[str] = []

    def on_approval(request: pb.ApprovalRequest) -> str:
        asked.append(" ".join(request.command))
        return "approved_for_session"

    with Client(daemon.target, timeout=60) as client:
        with client.open_session(
            workspace, "workspace-write", env=session_env(workspace), approval_policy="untrusted"
        ) as s:
            adapter = ChatCompletionsAdapter(s, on_approval=on_approval)
            tc = {"id": "t1", "type": "function", "function": {"name": "shell", "arguments": '{"command":["touch","a"]}'}}
            for _ in range(2):
                msg = adapter.handle(tc)
                assert json.loads(msg["content"])["metadata"]["exit_code"] == 0
    assert asked == ["touch a"]
    assert (workspace / "a").exists()


def test_decide_approval_and_classify_command_sync_and_async(daemon, workspace):
    with Client(daemon.target, timeout=60) as client:
        assert client.classify_command(["ls", "-la"]) is True
        assert client.classify_command(["rm", "x"]) is False
        with client.open_session(
            workspace, "workspace-write", env=session_env(workspace), approval_policy="untrusted"
        ) as s:
            r = s.invoke("shell", {"command": ["touch", "t"]}, call_id="c9")
            assert r.HasField("approval") and r.output == ""
            request = r.approval
            assert request.call_id == "c9" and request.kind == pb.APPROVAL_KIND_BEFORE_RUN
            with pytest.raises(NotFound):
                s.decide_approval("0" * 32, "approved")
            assert not (workspace / "t").exists()
            done = s.decide_approval(request.approval_id, True)
            assert done.WhichOneof("result") == "invoke" and done.invoke.success
            assert (workspace / "t").exists()
            with pytest.raises(FailedPrecondition):
                s.decide_approval(request.approval_id, "denied")

            async def main():
                async with AsyncClient(daemon.target, timeout=30) as aclient:
                    assert await aclient.classify_command(["bash", "-lc", "ls && pwd"]) is True
                    a = aclient.session(s.id)
                    r = await a.invoke("shell", {"command": ["touch", "u"]})
                    done = await a.decide_approval(r.approval.approval_id, "denied")
                    return done.invoke

            denied = asyncio.run(asyncio.wait_for(main(), 60))
            assert (denied.output, denied.success) == (REJECTED, False)
            assert not (workspace / "u").exists()
