"""Tools on the OpenAI chat endpoint: `tools`, `tool_choice` and the tool fields of
messages in, `tool_calls` out.

Plain dicts in, plain dicts out, errors `InvalidArgument` naming the OpenAI field. Tools
are checked when the request arrives (names, JSON schemas with local `$ref`s only, so
checking a call never fetches anything). A call's `arguments` arrive as a JSON string and
reach the chat template as an object, as templates read them; calls go out with
`arguments` as a JSON string again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from tidal.common.errors import InvalidArgument
from tidal.inference.openai.tool_call_stream import StreamedCall, ToolCallStream
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


def chat_tools(body: Mapping[str, Any]) -> ChatTools:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat body, checked."""
    raw = body.get("tools")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise InvalidArgument("tools", "must be a list of tools")
    tools = tuple(_tool(i, t) for i, t in enumerate(raw))
    names = [t["function"]["name"] for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
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
    parameters = function.get("parameters", {"type": "object"})
    _check_schema(f"tools[{i}].function.parameters", parameters)
    return {"type": "function", "function": function}


def _check_schema(field: str, schema: Any) -> None:
    if not isinstance(schema, dict):
        raise InvalidArgument(field, "must be a JSON schema object")
    try:
        validator_for(schema).check_schema(schema)
        refs = list(_refs(schema))
    except SchemaError as e:
        raise InvalidArgument(field, f"is not a valid JSON schema: {e.message}") from None
    except RecursionError:
        raise InvalidArgument(field, "is nested too deeply") from None
    outside = [r for r in refs if not r.startswith("#")]
    if outside:
        raise InvalidArgument(field, f"$ref {outside[0][:100]!r}: only local references (#...)")


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(item, str):
                yield item
            yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


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
