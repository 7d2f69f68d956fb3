"""Adapters between OpenAI-style model output and corral's bridge.

The adapters know nothing about the individual tools: they forward each call to ``Invoke`` and wrap
corral's answer (exactly what Codex would send back) in the item the API expects next.

Items may be plain dicts or the OpenAI SDK's objects (anything with the same attributes); the
adapters always return plain dicts.

``start(prompt)`` opens a conversation the way Codex does: the session's AGENTS.md instructions
and environment context (``GetPromptContext``) come first, then the user's prompt.

Under a session's approval policy a call may come back as an approval request instead of a
result. The adapters then ask ``on_approval(request)`` (default: deny) and answer the daemon until
the call has its result, so the model always gets what Codex would send it: the command's output,
or ``exec command rejected by user``.

An agent loop never crashes on a tool result: an error that the model's own call caused — a result
too large to send or receive (``RESOURCE_EXHAUSTED``: a ``read_file`` with a huge limit), bad
arguments (``INVALID_ARGUMENT``, ``OUT_OF_RANGE``) — becomes model text with ``success=False``,
which the model can act on ("ask for less"). Errors of the connection, the credentials or the
session (``Unavailable``, ``Unauthenticated``, ``PermissionDenied``, ``NotFound``, …) still raise:
they are the host's to handle.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

from . import _core
from ._proto import corral_pb2 as pb
from .client import Session
from .errors import CorralError, DeadlineExceeded, InvalidArgument, OutOfRange, ResourceExhausted

__all__ = ["MODEL_ERRORS", "ChatCompletionsAdapter", "ResponsesAdapter", "deny_all", "model_error_text"]

# The user's decision on an ApprovalRequest: "approved", "approved_for_session", "denied" (or the
# enum), True (approve once) or False/None (deny).
Decision = Union[str, int, bool, None]
OnApproval = Callable[[pb.ApprovalRequest], Decision]


def deny_all(request: pb.ApprovalRequest) -> Decision:
    """The default ``on_approval``: nobody is there to ask, so every request is denied."""
    return "denied"


def _settled(session: Session, resp: pb.InvokeResponse, on_approval: OnApproval) -> pb.InvokeResponse:
    """``resp`` with its approval requests answered by ``on_approval`` until it is a result. A
    request that expired before the answer arrived gives the model its ``rejected_output``."""
    while resp.HasField("approval"):
        request = resp.approval
        decision = on_approval(request)
        try:
            decided = session.decide_approval(request.approval_id, decision)
        except DeadlineExceeded as e:
            # Expired on the daemon (not this call's own deadline): nothing ran.
            if "expired at" not in str(e):
                raise
            return _core.rejected_invoke(request)
        if decided.WhichOneof("result") != "invoke":
            raise RuntimeError(f"the daemon answered a model call's approval with {decided.WhichOneof('result')!r}")
        resp = decided.invoke
    return resp


# The errors that mean "the model asked for something that cannot be", not a broken host.
MODEL_ERRORS: tuple[type[CorralError], ...] = (ResourceExhausted, InvalidArgument, OutOfRange)

_ASK_FOR_LESS = (
    "ask for less (read_file: offset and limit; list_dir and grep_files: limit; a command: send its "
    "output to a file and read that in parts)"
)


def model_error_text(error: BaseException) -> str | None:
    """The model text for an error the model's call caused (:data:`MODEL_ERRORS`), or None. The
    daemon's own words when it said how to do better; a result over this client's receive limit
    (gRPC's ``Received message larger than max …``) says how to ask for less."""
    if not isinstance(error, MODEL_ERRORS):
        return None
    if isinstance(error, ResourceExhausted) and "ask for less" not in error.message:
        return f"the result is too large to receive ({error.message}); {_ASK_FOR_LESS}"
    return error.message


def _for_model(call_id: str, call: Callable[[], pb.InvokeResponse]) -> pb.InvokeResponse:
    """``call()`` (an Invoke and its approvals); an error the model caused becomes its result."""
    try:
        return call()
    except MODEL_ERRORS as e:
        return pb.InvokeResponse(call_id=call_id, output=model_error_text(e) or str(e), success=False)


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _require(obj: Any, key: str, kind: str) -> Any:
    value = _get(obj, key)
    if value is None:
        raise ValueError(f"{kind} has no {key!r}")
    return value


def _content_items(resp: Any) -> list[dict[str, Any]]:
    """An output's content items (view_image's image) as Responses API input items."""
    items: list[dict[str, Any]] = []
    for item in getattr(resp, "content_items", ()):
        kind = item.WhichOneof("item")
        if kind == "input_text":
            items.append({"type": "input_text", "text": item.input_text})
        elif kind == "input_image":
            image = {"type": "input_image", "image_url": item.input_image.image_url}
            if item.input_image.detail:
                image["detail"] = item.input_image.detail
            items.append(image)
    return items


def _chat_content(resp: Any) -> str | list[dict[str, Any]]:
    """A tool message's content: the output text, or, when the output is content items
    (view_image's image), Chat Completions content parts, as Codex sends them (an image as
    ``{"type": "image_url", "image_url": {"url": …}}``; Chat Completions has no ``original``
    detail, so none is sent)."""
    parts: list[dict[str, Any]] = []
    for item in getattr(resp, "content_items", ()):
        kind = item.WhichOneof("item")
        if kind == "input_text":
            parts.append({"type": "text", "text": item.input_text})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": item.input_image.image_url}})
    return parts or resp.output


class ResponsesAdapter:
    """Tools and tool-call handling for the OpenAI Responses API.

    ``tools()`` is the request's ``tools`` list (function tools plus the freeform ``apply_patch``);
    ``handle(item)`` runs a ``function_call`` or ``custom_tool_call`` output item and returns the
    ``function_call_output`` / ``custom_tool_call_output`` input item for the next request. Every
    tool of the session's set goes the same way (``exec_command``/``write_stdin``, ``update_plan``,
    …); an output made of content items (view_image's image) is sent as that array of
    ``input_image``/``input_text`` items. ``on_approval(request)`` decides the session's approval
    requests (see the module docs; default: deny).
    """

    TOOL_CALL_TYPES = ("function_call", "custom_tool_call")

    def __init__(
        self, session: Session, *, exclude: Sequence[str] = (), on_approval: OnApproval | None = None
    ):
        self.session = session
        self.exclude = tuple(exclude)
        self.on_approval = on_approval or deny_all

    def _invoke(self, name: str, arguments: str, call_id: str, freeform: bool = False) -> pb.InvokeResponse:
        def call() -> pb.InvokeResponse:
            resp = self.session.invoke(name, arguments, call_id=call_id, freeform=freeform)
            return _settled(self.session, resp, self.on_approval)

        return _for_model(call_id, call)

    def tools(self) -> list[dict[str, Any]]:
        return self.session.list_tools("responses", exclude=self.exclude)

    @staticmethod
    def user_message(text: str) -> dict[str, Any]:
        """A user message input item."""
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    def start(
        self,
        prompt: str | None = None,
        *,
        developer_instructions: str | None = None,
        project_doc_max_bytes: int | None = None,
    ) -> list[dict[str, Any]]:
        """The first input items of a conversation, in Codex's order: the developer message
        (when given), the AGENTS.md instructions (when the session's cwd has any) and the
        environment context, then the prompt as a user message (when given). The system prompt
        is the request's ``instructions``, not an item."""
        items: list[dict[str, Any]] = []
        if developer_instructions:
            items.append(
                {"type": "message", "role": "developer",
                 "content": [{"type": "input_text", "text": developer_instructions}]}
            )  # fmt: skip
        context = self.session.get_prompt_context(project_doc_max_bytes=project_doc_max_bytes)
        items += json.loads(context.responses_input_json)
        if prompt is not None:
            items.append(self.user_message(prompt))
        return items

    def is_tool_call(self, item: Any) -> bool:
        return _get(item, "type") in self.TOOL_CALL_TYPES

    def handle(self, item: Any) -> dict[str, Any]:
        kind = _get(item, "type")
        call_id = _require(item, "call_id", kind or "item")
        name = _require(item, "name", kind or "item")
        if kind == "function_call":
            resp = self._invoke(name, _get(item, "arguments") or "{}", call_id)
            items = _content_items(resp)
            return {"type": "function_call_output", "call_id": call_id, "output": items or resp.output}
        if kind == "custom_tool_call":
            resp = self._invoke(name, _get(item, "input") or "", call_id, freeform=True)
            return {"type": "custom_tool_call_output", "call_id": call_id, "output": resp.output}
        raise ValueError(f"not a tool call item: type {kind!r}")

    def handle_all(self, items: Iterable[Any]) -> list[dict[str, Any]]:
        """The output items for every tool call among ``items`` (other items are skipped), in order."""
        return [self.handle(item) for item in items if self.is_tool_call(item)]


class ChatCompletionsAdapter:
    """Tools and tool-call handling for the Chat Completions API.

    ``tools()`` is the request's ``tools`` list (function tools; ``apply_patch`` in its JSON form);
    ``handle(tool_call)`` runs one entry of an assistant message's ``tool_calls`` and returns the
    ``{"role": "tool", ...}`` message that answers it. Its ``content`` is the output text, or for
    an output made of content items (view_image's image) the content parts Codex sends
    (``{"type": "image_url", "image_url": {"url": "data:…"}}``). ``on_approval(request)`` decides
    the session's approval requests (see the module docs; default: deny).
    """

    def __init__(
        self, session: Session, *, exclude: Sequence[str] = (), on_approval: OnApproval | None = None
    ):
        self.session = session
        self.exclude = tuple(exclude)
        self.on_approval = on_approval or deny_all

    def tools(self) -> list[dict[str, Any]]:
        return self.session.list_tools("chat", exclude=self.exclude)

    @staticmethod
    def user_message(text: str) -> dict[str, Any]:
        """A user message."""
        return {"role": "user", "content": text}

    def start(
        self,
        prompt: str | None = None,
        *,
        instructions: str | None = None,
        developer_instructions: str | None = None,
        project_doc_max_bytes: int | None = None,
    ) -> list[dict[str, Any]]:
        """The first messages of a conversation, in Codex's order: the system prompt
        (``instructions``) and the developer message (when given), the AGENTS.md instructions
        (when the session's cwd has any) and the environment context, then the prompt as a user
        message (when given)."""
        messages: list[dict[str, Any]] = []
        if instructions:
            messages.append({"role": "system", "content": instructions})
        if developer_instructions:
            messages.append({"role": "developer", "content": developer_instructions})
        context = self.session.get_prompt_context(project_doc_max_bytes=project_doc_max_bytes)
        messages += json.loads(context.chat_messages_json)
        if prompt is not None:
            messages.append(self.user_message(prompt))
        return messages

    def handle(self, tool_call: Any) -> dict[str, Any]:
        call_id = _require(tool_call, "id", "tool call")
        kind = _get(tool_call, "type", "function")
        if kind == "function":
            fn = _require(tool_call, "function", "tool call")
            name = _require(fn, "name", "tool call function")
            arguments, freeform = _get(fn, "arguments") or "{}", False
        elif kind == "custom":
            custom = _require(tool_call, "custom", "tool call")
            name = _require(custom, "name", "custom tool call")
            arguments, freeform = _get(custom, "input") or "", True
        else:
            raise ValueError(f"unsupported tool call type {kind!r}")

        def call() -> pb.InvokeResponse:
            resp = self.session.invoke(name, arguments, call_id=call_id, freeform=freeform)
            return _settled(self.session, resp, self.on_approval)

        resp = _for_model(call_id, call)
        return {"role": "tool", "tool_call_id": call_id, "content": _chat_content(resp)}

    def handle_message(self, message: Any) -> list[dict[str, Any]]:
        """The tool messages answering every tool call of an assistant message (none: ``[]``)."""
        return [self.handle(tc) for tc in (_get(message, "tool_calls") or [])]
