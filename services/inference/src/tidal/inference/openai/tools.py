"""Tools on the OpenAI chat endpoint: `tools`, `tool_choice` and the tool fields of
messages in, `tool_calls` out.

Plain dicts in, plain dicts out, errors `InvalidArgument` naming the OpenAI field. Tools
are checked cheapest first: count and size before any tool is looked at, then each tool's
shape and name (duplicates in one pass); their JSON schemas, which cost time in their
size, are left to the caller (`schema_checks.SchemaChecks`, in a worker process). A call's
`arguments` reach the chat template as an object and go out as a JSON string again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidal.common.errors import InvalidArgument
from tidal.inference.config import RequestLimits
from tidal.inference.openai.tool_call_stream import StreamedCall, ToolCallStream
from tidal.inference.request_checks import DEFAULT_LIMITS
from tidal.text.tool_calls import ToolCallParser

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_CHOICES = ("auto", "none")


@dataclass(frozen=True)
class ChatTools:
    """The request's tools and whether generated text is read for calls."""

    tools: tuple[dict[str, Any], ...] = ()
    parse_calls: bool = False

    def template_tools(self) -> list[dict[str, Any]] | None:
        """What the chat template gets as `tools` (None: the template shows no tools)."""
        return list(self.tools) or None

    def stream(self, parser: ToolCallParser) -> ToolCallStream | None:
        """A splitter for one completion, when this request reads calls."""
        return ToolCallStream(parser, self.tools) if self.parse_calls else None


NO_TOOLS = ChatTools()


def chat_tools(body: Mapping[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> ChatTools:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat body, checked but for the
    tools' schemas (`SchemaChecks`, which costs time in their size)."""
    raw = body.get("tools")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise InvalidArgument("tools", "must be a list of tools")
    if len(raw) > limits.max_tools:
        raise InvalidArgument(
            "tools",
            f"{len(raw)} tools is more than the limit of {limits.max_tools} "
            "(inference.limits.max_tools)",
        )
    if raw and json_size_over(raw, limits.max_tools_bytes):
        raise InvalidArgument(
            "tools",
            f"the tools are more than {limits.max_tools_bytes} bytes of JSON "
            "(inference.limits.max_tools_bytes)",
        )
    tools = tuple(_tool(i, t) for i, t in enumerate(raw))
    declared: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if declared.setdefault(name, i) != i:
            raise InvalidArgument(f"tools[{i}].function.name", f"{name!r} is declared twice")
    choice = body.get("tool_choice")
    if choice is not None and choice not in _CHOICES:
        raise InvalidArgument(
            "tool_choice",
            '"auto" and "none" are served; "required" and a named function are not '
            "(forcing a call needs constrained decoding)",
        )
    if body.get("parallel_tool_calls") not in (None, True):
        raise InvalidArgument(
            "parallel_tool_calls", "only true (the default): a turn may hold several calls"
        )
    return ChatTools(tools, parse_calls=bool(tools) and choice != "none")


def _tool(i: int, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise InvalidArgument(f"tools[{i}]", 'must be an object with "type": "function"')
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidArgument(f"tools[{i}].function", "must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"tools[{i}].function.name", "must be 1-64 letters, digits, underscores or dashes"
        )
    if not isinstance(function.get("description", ""), str):
        raise InvalidArgument(f"tools[{i}].function.description", "must be a string")
    if not isinstance(function.get("parameters", {}), dict):
        raise InvalidArgument(f"tools[{i}].function.parameters", "must be a JSON schema object")
    return {"type": "function", "function": function}


def json_size_over(value: Any, budget: int) -> bool:
    """Whether `value` as JSON text is longer than `budget` characters (about: a string
    counts its characters and quotes, a number 8). Stops once past it, so an absurd value
    costs no more to refuse than one of `budget` characters."""
    size, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            size += len(item) + 3
        elif isinstance(item, dict):
            size += 2 + len(item)
            if size <= budget:
                pending += item.keys()
                pending += item.values()
        elif isinstance(item, list):
            size += 2 + len(item)
            if size <= budget:
                pending += item
        else:
            size += 8
        if size > budget:
            return True
    return False


def message_tool_fields(i: int, message: Mapping[str, Any]) -> dict[str, Any]:
    """The tool fields of `messages[i]` as the template reads them: an assistant's
    `tool_calls` (arguments as objects), a tool result's `tool_call_id` and `name`."""
    fields: dict[str, Any] = {}
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            if not isinstance(message[key], str):
                raise InvalidArgument(f"messages[{i}].{key}", "must be a string")
            fields[key] = message[key]
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise InvalidArgument(f"messages[{i}].tool_calls", "must be a list of calls")
        fields["tool_calls"] = [
            _call(f"messages[{i}].tool_calls[{j}]", c) for j, c in enumerate(calls)
        ]
    return fields


def _call(field: str, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidArgument(
            field, 'must be {"type": "function", "function": {"name", "arguments"}}'
        )
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise InvalidArgument(f"{field}.function.arguments", "is not JSON") from None
    if not isinstance(arguments, dict):
        raise InvalidArgument(f"{field}.function.arguments", "must be a JSON object")
    out: dict[str, Any] = {
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def tool_text(tools: ChatTools, messages: Sequence[Mapping[str, Any]]) -> str:
    """The tools' and calls' text the template will render (for the prompt size check)."""
    calls = [c for m in messages for c in m.get("tool_calls", ())]
    return (
        json.dumps([list(tools.tools), calls], ensure_ascii=False) if tools.tools or calls else ""
    )


def tool_reply(stream: ToolCallStream, text: str, *, last: bool, streamed: bool) -> dict[str, Any]:
    """A message's (or delta's) `content` and `tool_calls` for this piece of its text."""
    content, calls = stream.push(text, last=last)
    if not calls:
        return {"content": content or (None if streamed else "")}
    return {"content": content or None, "tool_calls": openai_calls(calls, streamed=streamed)}


def openai_calls(calls: Sequence[StreamedCall], *, streamed: bool) -> list[dict[str, Any]]:
    """OpenAI's `tool_calls` entries (with `index` in a streamed delta)."""
    return [
        {
            **({"index": c.index} if streamed else {}),
            "id": c.id,
            "type": "function",
            "function": {
                "name": c.call.name,
                "arguments": json.dumps(c.call.arguments, ensure_ascii=False),
            },
        }
        for c in calls
    ]
