"""An agent's chat.completions body → the messages and tools to render, or a 400 naming the field.

The gateway samples with the run's settings (temperature, top_p, seed: what the policy is
trained on), so the agent's sampling fields are accepted and not applied; only `max_tokens`
(or `max_completion_tokens`) may lower the run's bound. `n` choices (up to `MAX_CHOICES`)
are sampled from the one prompt; each becomes a sample of the episode (gateway/trace.py).
Each message has a render form (what the chat template gets: arguments as
objects) and a key (role, text, calls with canonical arguments) that says whether a later
call's history repeats it, whatever fields a client adds when it echoes a reply back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidal.common.errors import InvalidArgument

ROLES = ("system", "user", "assistant", "tool")
MAX_MESSAGES = 1024
MAX_CHOICES = 16


@dataclass(frozen=True)
class ChatCall:
    """One validated chat request."""

    messages: list[dict[str, Any]]
    """The messages as the chat template renders them."""
    keys: list[str]
    """One comparison key per message (`message_key`)."""
    tools: tuple[dict[str, Any], ...]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    logprobs: bool
    n: int = 1
    """Choices to sample from the one prompt."""


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise InvalidArgument(f"{where}[{j}]", "only text content parts are served")
            if not isinstance(part.get("text"), str):
                raise InvalidArgument(f"{where}[{j}].text", "must be a string")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidArgument(where, "must be a string, null or a list of text parts")


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise InvalidArgument(where, "must be a JSON string (or an object)")
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        raise InvalidArgument(where, "is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidArgument(where, "must encode a JSON object")
    return value


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidArgument(where, "must be a list")
    calls = []
    for j, call in enumerate(raw):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidArgument(f"{where}[{j}].function.name", "must be a string")
        arguments = _arguments(function.get("arguments"), f"{where}[{j}].function.arguments")
        calls.append(
            {
                "id": str(call.get("id") or ""),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return calls


def message_key(message: Mapping[str, Any]) -> str:
    """What decides whether two messages render the same in a history (canonical JSON)."""
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
    ]
    return json.dumps([message["role"], message["content"], calls], sort_keys=True)


def _message(raw: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise InvalidArgument(where, "must be an object")
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidArgument(f"{where}.role", f"must be one of {', '.join(ROLES)}")
    message: dict[str, Any] = {"role": role, "content": _text(raw.get("content"), where)}
    calls = _tool_calls(raw.get("tool_calls"), f"{where}.tool_calls")
    if calls:
        if role != "assistant":
            raise InvalidArgument(f"{where}.tool_calls", "only assistant messages carry calls")
        message["tool_calls"] = calls
    for name in ("name", "tool_call_id"):
        if isinstance(raw.get(name), str):
            message[name] = raw[name]
    return message


def _tools(raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidArgument("tools", "must be a list")
    for j, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidArgument(f"tools[{j}].function.name", "must be a string")
    return tuple(dict(t) for t in raw)


def _positive_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(name, "must be a positive integer")
    return value


def parse_chat_call(body: Mapping[str, Any]) -> ChatCall:
    """The request `body` (a JSON object) as a ChatCall; InvalidArgument naming the field."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("messages", "must be a non-empty list")
    if len(raw) > MAX_MESSAGES:
        raise InvalidArgument("messages", f"at most {MAX_MESSAGES} messages")
    messages = [_message(m, i) for i, m in enumerate(raw)]
    n = _positive_int(body, "n") or 1
    if n > MAX_CHOICES:
        raise InvalidArgument("n", f"at most {MAX_CHOICES} choices per call")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidArgument("stream", "must be a boolean")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise InvalidArgument("stream_options", "must be an object")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise InvalidArgument("logprobs", "must be a boolean")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    return ChatCall(
        messages=messages,
        keys=[message_key(m) for m in messages],
        tools=_tools(body.get("tools")),
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        max_tokens=max_tokens,
        logprobs=logprobs,
        n=n,
    )
