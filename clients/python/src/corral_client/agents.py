"""A corral session's tools as OpenAI Agents SDK function tools (``pip install 'corral-client[agents]'``).

    from agents import Agent, Runner
    from corral_client import Client
    from corral_client.agents import function_tools

    with Client() as client, client.open_session(".", "workspace-write") as session:
        agent = Agent(name="coder", instructions="…", tools=function_tools(session))
        result = Runner.run_sync(agent, "Run the tests and fix what fails.")

Each tool the session offers (``session.list_tools(format="chat")``: ``exec_command``,
``write_stdin``, ``apply_patch`` taking ``{"input": PATCH}``, …) becomes a ``FunctionTool`` with
corral's name, description and JSON schema (not strict: corral's optional fields stay optional).
A call runs ``session.invoke(name, arguments)`` in a worker thread (``asyncio.to_thread``: the
blocking gRPC call never holds the event loop) and returns what Codex would send the model: the
tool's text, failures included, or for ``view_image`` the image as a ``ToolOutputImage`` (a
``data:`` URL; the SDK sends it to the model as an ``input_image``). The SDK's ``ToolOutputImage``
has no ``original`` detail: an image asked for at its original resolution is sent with ``high``.

Errors the model's call caused (a result too large, bad arguments) are its text, as in the
adapters; the session's approval requests are answered by ``on_approval`` (default: deny). The
connection's, the credentials' and the session's errors raise, and the SDK handles them as it
does any failing tool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ._proto import corral_pb2 as pb
from .adapters import OnApproval, _for_model, _settled, deny_all
from .client import Session

try:
    from agents import FunctionTool, ToolOutputImage, ToolOutputText
except ImportError as _e:
    raise ImportError(
        "corral_client.agents needs the OpenAI Agents SDK (openai-agents, Python 3.10+): "
        "pip install 'corral-client[agents]'"
    ) from _e

__all__ = ["function_tools", "tool_output"]

# The details ToolOutputImage accepts; Codex's "original" (full resolution) is sent as "high".
_DETAILS = ("low", "high", "auto")


def tool_output(resp: pb.InvokeResponse) -> str | list[ToolOutputText | ToolOutputImage]:
    """What a function tool returns to the SDK for an Invoke answer: the output text, or when the
    answer is content items (view_image's image) those items as ``ToolOutputImage`` /
    ``ToolOutputText``."""
    items: list[ToolOutputText | ToolOutputImage] = []
    for item in resp.content_items:
        kind = item.WhichOneof("item")
        if kind == "input_text":
            items.append(ToolOutputText(text=item.input_text))
        elif kind == "input_image":
            detail = item.input_image.detail
            if detail and detail not in _DETAILS:
                detail = "high"
            items.append(ToolOutputImage(image_url=item.input_image.image_url, detail=detail or None))
    return items or resp.output


def _tool(session: Session, spec: dict[str, Any], on_approval: OnApproval) -> FunctionTool:
    fn = spec["function"]
    name = fn["name"]

    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        call_id = getattr(ctx, "tool_call_id", "") or ""

        def call() -> pb.InvokeResponse:
            resp = session.invoke(name, arguments or "{}", call_id=call_id)
            return _settled(session, resp, on_approval)

        resp = await asyncio.to_thread(_for_model, call_id, call)
        return tool_output(resp)

    return FunctionTool(
        name=name,
        description=fn.get("description", ""),
        params_json_schema=fn.get("parameters") or {"type": "object", "properties": {}},
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=False,
    )


def function_tools(
    session: Session, *, exclude: Sequence[str] = (), on_approval: OnApproval | None = None
) -> list[FunctionTool]:
    """The session's tools (all of its tool set but ``exclude``) as Agents SDK ``FunctionTool``s,
    for ``Agent(tools=…)``. ``session`` is a blocking :class:`corral_client.Session`; it must stay
    open while the agent runs."""
    specs = session.list_tools("chat", exclude=exclude)
    return [_tool(session, spec, on_approval or deny_all) for spec in specs]
