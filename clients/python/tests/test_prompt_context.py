"""GetPromptContext from the Python client (sync and asyncio), and the adapters' start(): Codex's
opening of a conversation, the AGENTS.md instructions and the environment context first."""

from __future__ import annotations

import asyncio
import json

from conftest import session_env
from corral_client import ChatCompletionsAdapter, ResponsesAdapter
from corral_client.aio import AsyncClient


def test_prompt_context_sync_and_async(client, daemon, workspace):
    (workspace / "AGENTS.md").write_text("Run make check.\n")
    with client.open_session(workspace, env=session_env(workspace)) as s:
        ctx = s.get_prompt_context()
        assert ctx.cwd == str(workspace)
        assert [d.path for d in ctx.project_docs] == [str(workspace / "AGENTS.md")]
        assert ctx.user_instructions.startswith(f"# AGENTS.md instructions for {workspace}")
        assert "Run make check." in ctx.user_instructions
        items = json.loads(ctx.responses_input_json)
        assert [i["content"][0]["text"] for i in items] == [ctx.user_instructions, ctx.environment_context]
        assert json.loads(ctx.chat_messages_json) == [
            {"role": "user", "content": ctx.user_instructions},
            {"role": "user", "content": ctx.environment_context},
        ]
        none = client.get_prompt_context(s.id, project_doc_max_bytes=0)
        assert none.user_instructions == "" and len(json.loads(none.responses_input_json)) == 1

        async def main():
            async with AsyncClient(daemon.target, timeout=30) as aclient:
                return await aclient.session(s.id).get_prompt_context()

        assert asyncio.run(asyncio.wait_for(main(), 60)) == ctx


def test_adapters_start_a_conversation_as_codex_does(client, workspace):
    (workspace / "AGENTS.md").write_text("Be brief.\n")
    with client.open_session(workspace, env=session_env(workspace)) as s:
        ctx = s.get_prompt_context()
        items = ResponsesAdapter(s).start("fix the bug", developer_instructions="dev")
        assert [(i["role"], i["content"][0]["text"]) for i in items] == [
            ("developer", "dev"),
            ("user", ctx.user_instructions),
            ("user", ctx.environment_context),
            ("user", "fix the bug"),
        ]
        assert all(i["type"] == "message" and i["content"][0]["type"] == "input_text" for i in items)
        assert ResponsesAdapter(s).start(project_doc_max_bytes=0) == json.loads(
            s.get_prompt_context(project_doc_max_bytes=0).responses_input_json
        )
        messages = ChatCompletionsAdapter(s).start("fix the bug", instructions="system prompt")
        assert messages == [
            {"role": "system", "content": "system prompt"},
            {"role": "user", "content": ctx.user_instructions},
            {"role": "user", "content": ctx.environment_context},
            {"role": "user", "content": "fix the bug"},
        ]
