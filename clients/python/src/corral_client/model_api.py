"""A minimal client of an OpenAI-style model API: the Responses API or Chat Completions.

Only the standard library (``urllib``): one JSON POST per model call, no streaming, no SDK. Any
compatible endpoint works (``base_url``). The settings come from arguments or the environment:

- ``CORRAL_MODEL_API``: ``responses`` (the default, Codex's wire API) or ``chat``;
- ``OPENAI_BASE_URL``: the API root (default ``https://api.openai.com/v1``);
- ``OPENAI_API_KEY``: sent as a bearer token when set (a local endpoint may need none);
- ``OPENAI_MODEL``: the model (default ``gpt-5-codex``).

The key is read from the environment only, never from a command line (where ``ps`` shows it).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "APIS",
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "ModelAPI",
    "ModelAPIError",
    "ModelSettings",
    "chat_text",
    "responses_text",
]

APIS = ("responses", "chat")
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-5-codex"
# An error body is model-provider text of any size: enough of it to see what went wrong.
_ERROR_BODY_CHARS = 2000


class ModelAPIError(RuntimeError):
    """The model API could not be reached, or answered with an error or an unexpected shape."""


@dataclass(frozen=True)
class ModelSettings:
    """Which API, where, with which key and model. ``timeout`` bounds one model call (seconds)."""

    api: str = "responses"
    base_url: str = DEFAULT_BASE_URL
    api_key: str = ""
    model: str = DEFAULT_MODEL
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"unknown model API {self.api!r}: use 'responses' or 'chat'")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"model API base URL {self.base_url!r} is not an http(s) URL")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, key_var: str = "OPENAI_API_KEY", **overrides: Any
    ) -> ModelSettings:
        """The settings from the environment (see the module docs); ``overrides`` that are not
        None win over it."""
        env = os.environ if env is None else env
        settings = cls(
            api=(env.get("CORRAL_MODEL_API") or "responses").strip().lower(),
            base_url=env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
            api_key=env.get(key_var, ""),
            model=env.get("OPENAI_MODEL") or DEFAULT_MODEL,
        )
        return replace(settings, **{k: v for k, v in overrides.items() if v is not None})

    def __repr__(self) -> str:  # never print the key
        key = "set" if self.api_key else "unset"
        return (
            f"ModelSettings(api={self.api!r}, base_url={self.base_url!r}, api_key={key}, "
            f"model={self.model!r}, timeout={self.timeout!r})"
        )


class ModelAPI:
    """One model call per :meth:`responses` / :meth:`chat` call, blocking."""

    def __init__(self, settings: ModelSettings):
        self.settings = settings

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.settings.base_url.rstrip("/") + path
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:_ERROR_BODY_CHARS]
            raise ModelAPIError(f"model API {url} answered HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ModelAPIError(f"model API {url} unreachable: {reason}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise ModelAPIError(f"model API {url} answered with something that is not JSON") from None
        if not isinstance(answer, dict):
            raise ModelAPIError(f"model API {url} answered with JSON that is not an object")
        return answer

    def responses(
        self,
        *,
        instructions: str,
        input: Sequence[Any],
        tools: Sequence[Any],
        model: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """POST ``/responses``; returns the response's ``output`` items. ``extra`` adds request
        fields (e.g. ``reasoning``)."""
        body = {
            "model": model or self.settings.model,
            "instructions": instructions,
            "input": list(input),
            "tools": list(tools),
            "tool_choice": "auto",
            **dict(extra or {}),
        }
        answer = self._post("/responses", body)
        if answer.get("error"):
            raise ModelAPIError(f"model API error: {_error_text(answer['error'])}")
        output = answer.get("output")
        if not isinstance(output, list) or not all(isinstance(i, dict) for i in output):
            raise ModelAPIError("the Responses API answer has no output list")
        if answer.get("status") in ("failed", "incomplete") and not output:
            raise ModelAPIError(
                f"the model's response is {answer['status']}: {answer.get('incomplete_details')}"
            )
        return output

    def chat(
        self,
        *,
        messages: Sequence[Any],
        tools: Sequence[Any],
        model: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """POST ``/chat/completions``; returns the first choice's assistant message."""
        body = {
            "model": model or self.settings.model,
            "messages": list(messages),
            "tools": list(tools),
            "tool_choice": "auto",
            **dict(extra or {}),
        }
        answer = self._post("/chat/completions", body)
        if answer.get("error"):
            raise ModelAPIError(f"model API error: {_error_text(answer['error'])}")
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ModelAPIError("the Chat Completions answer has no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ModelAPIError("the Chat Completions answer's first choice has no message")
        return message


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:_ERROR_BODY_CHARS]
    return str(error)[:_ERROR_BODY_CHARS]


def responses_text(items: Sequence[Mapping[str, Any]]) -> str | None:
    """The text of the last assistant message among Responses API output items (None: none)."""
    text = None
    for item in items:
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant":
            parts = item.get("content") or []
            if isinstance(parts, str):
                text = parts
            else:
                text = "".join(
                    str(p.get("text", ""))
                    for p in parts
                    if isinstance(p, dict) and p.get("type") == "output_text"
                )
    return text


def chat_text(message: Mapping[str, Any]) -> str:
    """An assistant message's text (its ``content``, a string or text parts)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
