"""Replays the recorded transcript (clients/fixtures/transcript.json) against a real daemon.

Each model output item goes through the adapter, and the input item it returns must equal the
recorded one exactly; only the shell tools' wall time is normalised (conftest.normalize).
"""

from __future__ import annotations

import pytest
from conftest import (
    is_unsupported,
    load_transcript,
    normalize_item,
    open_transcript_session,
    populate,
    substitute,
)
from corral_client import ChatCompletionsAdapter, ResponsesAdapter

TRANSCRIPT = load_transcript()
ITEMS = TRANSCRIPT["items"]


def _id(item):
    return f"{item['input']['call_id']}-{item['input']['name']}"


@pytest.fixture(scope="module")
def replay(client, tmp_path_factory):
    """One workspace and one session for the whole transcript, as in the recorded run."""
    import os
    from pathlib import Path

    ws = Path(os.path.realpath(tmp_path_factory.mktemp("transcript")))
    populate(ws, substitute(TRANSCRIPT["files"], ws))
    with open_transcript_session(client, ws, TRANSCRIPT["session"]) as session:
        yield ws, session, ResponsesAdapter(session), {}


@pytest.mark.parametrize("index", range(len(ITEMS)), ids=[_id(i) for i in ITEMS])
def test_responses_item(replay, index):
    ws, _, adapter, seen = replay
    item = ITEMS[index]
    call = substitute(item["input"], ws)
    expected = substitute(item["expected"], ws)
    assert adapter.is_tool_call(call)
    got = adapter.handle(call)
    seen[index] = got
    if is_unsupported(got["output"], item):
        pytest.xfail(f"the daemon does not serve {item['requires']} yet: {got['output']!r}")
    assert normalize_item(got) == normalize_item(expected)


def test_files_after_the_transcript(replay):
    """The workspace after the replay (apply_patch's edits), once every item has run."""
    ws, _, _, seen = replay
    if len(seen) != len(ITEMS):
        pytest.skip("runs after the whole transcript only")
    unsupported = [i for i, got in seen.items() if is_unsupported(got["output"], ITEMS[i])]
    if unsupported:
        pytest.xfail(f"the daemon does not serve {ITEMS[unsupported[0]]['requires']} yet")
    for rel, content in substitute(TRANSCRIPT["files_after"], ws).items():
        assert (ws / rel).read_text(encoding="utf-8") == content, rel


def test_chat_completions_shape(client, workspace):
    """The function calls again, as Chat Completions tool_calls -> tool messages."""
    populate(workspace, substitute(TRANSCRIPT["files"], workspace))
    with open_transcript_session(client, workspace, TRANSCRIPT["session"]) as session:
        adapter = ChatCompletionsAdapter(session)
        for item in ITEMS:
            call = substitute(item["input"], workspace)
            if call["type"] != "function_call":
                continue  # custom tool calls have no Chat Completions form
            expected = substitute(item["expected"], workspace)
            tool_call = {
                "id": call["call_id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            got = adapter.handle(tool_call)
            assert normalize_item(got) == normalize_item(
                {"role": "tool", "tool_call_id": expected["call_id"], "content": expected["output"]}
            ), call["call_id"]
        # handle_message answers every tool call of an assistant message, in order.
        calls = [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"file_path":"README.md","limit":1}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "list_dir", "arguments": '{"dir_path":"docs"}'},
            },
        ]
        assert adapter.handle_message({"role": "assistant", "content": None, "tool_calls": calls}) == [
            {"role": "tool", "tool_call_id": "a", "content": "L1: # demo"},
            {"role": "tool", "tool_call_id": "b", "content": f"Absolute path: {workspace}/docs\nnotes.txt"},
        ]
        assert adapter.handle_message({"role": "assistant", "content": "done"}) == []
