"""Tool calls parsed from a policy's text, one parser per chat-template format.

A parser turns an assistant turn's text into its plain content and an ordered list of
calls, each either a `ToolCall` checked against the declared tools' JSON schemas or an
`InvalidCall` carrying the error the policy is answered with: a malformed call is data,
never an exception. The format a parser reads is the one its template writes for an
assistant message's `tool_calls`, so demonstrations and rollouts agree.
"""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator

from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.chat_template import ChatTemplateError
from tidal.text.tokenizer import Tokenizer

ParserName = Literal["auto", "hermes", "llama3_json", "byte"]


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of a declared tool with arguments its schema accepts."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InvalidCall:
    """Call text that cannot run: malformed, an unknown tool, or arguments off-schema."""

    text: str
    error: str
    name: str = ""


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn: its text outside the calls, and its calls in order."""

    content: str
    calls: tuple[ToolCall | InvalidCall, ...] = ()


def tool_spec(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `{name, description, parameters}` of an OpenAI-style tool (or of a bare one)."""
    function = tool.get("function")
    return function if isinstance(function, Mapping) else tool


def schema_validator(schema: Mapping[str, Any]) -> Validator:
    """The validator of a tool's parameters schema, built (and the schema checked against
    its metaschema) once per distinct schema: that costs far more than a validation, and
    every turn of every episode checks its calls on the orchestrator's event loop."""
    return _validator(json.dumps(schema))  # key order kept: it orders equally good errors


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check_call(
    name: Any, arguments: Any, text: str, tools: Sequence[Mapping[str, Any]]
) -> ToolCall | InvalidCall:
    """`name(arguments)` as a `ToolCall` if a declared tool accepts it, else why not."""
    if not isinstance(name, str) or not name:
        return InvalidCall(text, "a tool call needs a tool name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return InvalidCall(text, f"arguments of {name} are not JSON: {e.msg}", name)
        except RecursionError:
            return InvalidCall(text, f"arguments of {name} are nested too deeply", name)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return InvalidCall(text, f"arguments of {name} must be a JSON object", name)
    specs = {tool_spec(t).get("name"): tool_spec(t) for t in tools}
    if name not in specs:
        known = ", ".join(sorted(str(n) for n in specs)) or "none"
        return InvalidCall(text, f"unknown tool {name!r} (tools: {known})", name)
    schema = specs[name].get("parameters") or {"type": "object"}
    try:
        error = best_match(schema_validator(schema).iter_errors(arguments))
    except RecursionError:
        return InvalidCall(text, f"arguments of {name} are nested too deeply", name)
    if error is not None:  # the error `jsonschema.validate` would raise
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        return InvalidCall(text, f"{name}: {where}: {error.message}", name)
    return ToolCall(name, arguments)


class ToolCallParser(ABC):
    """Reads the tool calls of one template's format out of an assistant turn."""

    name: str

    @abstractmethod
    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> ParsedTurn:
        """`text` split into content and calls, each checked against `tools`."""


class _TaggedParser(ToolCallParser):
    """Calls wrapped in an open/close tag pair; the body is read by `_read`."""

    open_tag: str
    close_tag: str

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> ParsedTurn:
        calls: list[ToolCall | InvalidCall] = []
        content: list[str] = []
        rest = text
        while (start := rest.find(self.open_tag)) >= 0:
            content.append(rest[:start])
            body_at = start + len(self.open_tag)
            end = rest.find(self.close_tag, body_at)
            if end < 0:
                calls.append(InvalidCall(rest[start:], f"{self.open_tag} is never closed"))
                rest = ""
                break
            body = rest[body_at:end]
            calls.append(self._read(body.strip(), rest[start : end + len(self.close_tag)], tools))
            rest = rest[end + len(self.close_tag) :]
        content.append(rest)
        return ParsedTurn("".join(content).strip(), tuple(calls))

    @abstractmethod
    def _read(
        self, body: str, text: str, tools: Sequence[Mapping[str, Any]]
    ) -> ToolCall | InvalidCall: ...


class HermesParser(_TaggedParser):
    """Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

    name = "hermes"
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def _read(
        self, body: str, text: str, tools: Sequence[Mapping[str, Any]]
    ) -> ToolCall | InvalidCall:
        try:
            value = json.loads(body)
        except json.JSONDecodeError as e:
            return InvalidCall(text, f"tool call is not JSON: {e.msg}")
        except RecursionError:
            return InvalidCall(text, "tool call is nested too deeply")
        if not isinstance(value, dict):
            return InvalidCall(text, "tool call must be a JSON object with name and arguments")
        return check_call(value.get("name"), value.get("arguments"), text, tools)


class ByteCallParser(_TaggedParser):
    """The byte tokenizer's built-in template: `<call>name {"arg": ...}</call>` (short,
    so the tiny default model learns it quickly)."""

    name = "byte"
    open_tag, close_tag = "<call>", "</call>"

    def _read(
        self, body: str, text: str, tools: Sequence[Mapping[str, Any]]
    ) -> ToolCall | InvalidCall:
        name, _, arguments = body.partition(" ")
        return check_call(name, arguments, text, tools)


class Llama3JsonParser(ToolCallParser):
    """Llama 3.x JSON calls: the turn is `{"name": ..., "parameters": {...}}` objects
    (optionally after `<|python_tag|>`, several separated by `;`); other text is content."""

    name = "llama3_json"
    python_tag = "<|python_tag|>"

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> ParsedTurn:
        body = text.strip()
        tagged = body.startswith(self.python_tag)
        body = body.removeprefix(self.python_tag).lstrip()
        if not body.startswith("{"):
            if tagged:
                return ParsedTurn("", (InvalidCall(text, "<|python_tag|> without a JSON call"),))
            return ParsedTurn(text.strip())
        decoder = json.JSONDecoder()
        calls: list[ToolCall | InvalidCall] = []
        at = 0
        while at < len(body):
            try:
                value, end = decoder.raw_decode(body, at)
            except json.JSONDecodeError as e:
                calls.append(InvalidCall(body[at:], f"tool call is not JSON: {e.msg}"))
                break
            except RecursionError:
                calls.append(InvalidCall(body[at:], "tool call is nested too deeply"))
                break
            piece = body[at:end]
            if not isinstance(value, dict):
                calls.append(InvalidCall(piece, "tool call must be a JSON object"))
            else:
                arguments = value.get("parameters", value.get("arguments"))
                calls.append(check_call(value.get("name"), arguments, piece, tools))
            at = end
            while at < len(body) and body[at] in "; \n\t":
                at += 1
        return ParsedTurn("", tuple(calls))


PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "byte": ByteCallParser,
}
_PROBE_TOOLS = [{"type": "function", "function": {"name": "probe", "parameters": {}}}]


def tool_call_parser(tokenizer: Tokenizer, name: ParserName = "auto") -> ToolCallParser:
    """The parser `name`, or with "auto" the one matching `tokenizer`'s template: the byte
    tokenizer's own format; Llama 3's JSON calls where its template mentions
    `<|python_tag|>` or Llama 3 headers; Hermes/Qwen `<tool_call>` otherwise."""
    if name != "auto":
        if name not in PARSERS:
            raise ConfigError(f"tool-call parser {name!r}: choose one of {sorted(PARSERS)}")
        return PARSERS[name]()
    if isinstance(tokenizer, ByteTokenizer):
        return ByteCallParser()
    try:
        source = tokenizer.chat_template(tools=_PROBE_TOOLS).source  # type: ignore[attr-defined]
    except (AttributeError, ChatTemplateError):
        source = ""
    if "<|python_tag|>" in source or "<|start_header_id|>" in source:
        return Llama3JsonParser()
    return HermesParser()
