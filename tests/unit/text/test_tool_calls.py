"""Tool-call parsers: each format's valid, multiple, malformed, unknown-tool and off-schema
calls; the template of each format writes what its parser reads."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.tool_calls import (
    ByteCallParser,
    HermesParser,
    InvalidCall,
    Llama3JsonParser,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    schema_validator,
    tool_call_parser,
)

from ...hf_folders import build_model_folder

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "The value stored under a key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "name": "add",
    "description": "a + b",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
TOOLS = [LOOKUP, ADD]


def _hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def _byte(body: str) -> str:
    return f"<call>{body}</call>"


def _llama(body: str) -> str:
    return body


# (parser, how one call is written, how a call's JSON is written from name + args)
FORMATS = {
    "hermes": (HermesParser(), _hermes, lambda n, a: f'{{"name": "{n}", "arguments": {a}}}'),
    "byte": (ByteCallParser(), _byte, lambda n, a: f"{n} {a}"),
    "llama3_json": (
        Llama3JsonParser(),
        _llama,
        lambda n, a: f'{{"name": "{n}", "parameters": {a}}}',
    ),
}


def _call(fmt: str, name: str, args: str) -> str:
    _, wrap, body = FORMATS[fmt]
    return wrap(body(name, args))


def _parser(fmt: str) -> ToolCallParser:
    return FORMATS[fmt][0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_valid_call_is_parsed_with_its_arguments(fmt: str) -> None:
    parsed = _parser(fmt).parse(_call(fmt, "lookup", '{"key": "ab"}'), TOOLS)
    assert parsed.calls == (ToolCall("lookup", {"key": "ab"}),)


@pytest.mark.parametrize("fmt", FORMATS)
def test_several_calls_are_parsed_in_order(fmt: str) -> None:
    sep = ";" if fmt == "llama3_json" else "\n"
    text = sep.join([_call(fmt, "lookup", '{"key": "x"}'), _call(fmt, "add", '{"a": 1, "b": 2}')])
    parsed = _parser(fmt).parse(text, TOOLS)
    assert parsed.calls == (ToolCall("lookup", {"key": "x"}), ToolCall("add", {"a": 1, "b": 2}))


@pytest.mark.parametrize("fmt", FORMATS)
def test_malformed_json_is_an_invalid_call_not_an_exception(fmt: str) -> None:
    parsed = _parser(fmt).parse(_call(fmt, "lookup", '{"key": "ab"'), TOOLS)
    (call,) = parsed.calls
    assert isinstance(call, InvalidCall) and "not JSON" in call.error


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("depth", [300, 5000])
def test_deeply_nested_arguments_are_an_invalid_call_not_a_recursion_error(
    fmt: str, depth: int
) -> None:
    args = '{"key": ' + "[" * depth + "]" * depth + "}"
    (call,) = _parser(fmt).parse(_call(fmt, "lookup", args), TOOLS).calls
    assert isinstance(call, InvalidCall)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_unknown_tool_is_named_in_the_error(fmt: str) -> None:
    (call,) = _parser(fmt).parse(_call(fmt, "search", '{"q": "x"}'), TOOLS).calls
    assert isinstance(call, InvalidCall)
    assert "unknown tool 'search'" in call.error and "lookup" in call.error


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("args", "why"),
    [('{"key": 3}', "is not of type 'string'"), ("{}", "'key' is a required property")],
)
def test_arguments_off_the_schema_are_an_invalid_call(fmt: str, args: str, why: str) -> None:
    (call,) = _parser(fmt).parse(_call(fmt, "lookup", args), TOOLS).calls
    assert isinstance(call, InvalidCall) and why in call.error and call.name == "lookup"


def test_a_tools_schema_is_compiled_once_for_every_call_that_uses_it() -> None:
    # compiling (and metaschema-checking) a schema per call stalled the orchestrator's
    # event loop for every episode's every turn
    first = schema_validator(LOOKUP["function"]["parameters"])
    ByteCallParser().parse(_byte('lookup {"key": "ab"}'), [copy.deepcopy(LOOKUP)])
    assert schema_validator(copy.deepcopy(LOOKUP["function"]["parameters"])) is first


@pytest.mark.parametrize("fmt", ["hermes", "byte"])
def test_text_around_calls_is_the_content(fmt: str) -> None:
    text = "Let me look.\n" + _call(fmt, "lookup", '{"key": "ab"}')
    parsed = _parser(fmt).parse(text, TOOLS)
    assert parsed.content == "Let me look." and len(parsed.calls) == 1
    assert _parser(fmt).parse("The value is 7.", TOOLS) == ParsedTurn("The value is 7.")


@pytest.mark.parametrize("fmt", ["hermes", "byte"])
def test_an_unclosed_call_is_invalid(fmt: str) -> None:
    text = _call(fmt, "lookup", '{"key": "ab"}')
    (call,) = _parser(fmt).parse(text[: text.rfind("</")], TOOLS).calls
    assert isinstance(call, InvalidCall) and "never closed" in call.error


def test_llama3_reads_the_python_tag_and_leaves_prose_alone() -> None:
    parser = Llama3JsonParser()
    tagged = parser.parse('<|python_tag|>{"name": "lookup", "parameters": {"key": "k"}}', TOOLS)
    assert tagged.calls == (ToolCall("lookup", {"key": "k"}),)
    assert parser.parse("The answer is {not json}.", TOOLS) == ParsedTurn(
        "The answer is {not json}."
    )


def test_the_byte_template_writes_what_the_byte_parser_reads() -> None:
    tok = ByteTokenizer()
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": "ab"}}}
    chat = [
        {"role": "user", "content": "ab?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "xyz"},
    ]
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tools=TOOLS)
    assert text.startswith("<bos><|tools|>\nlookup: The value stored under a key.\nadd: a + b\n")
    turn = text.split("<|assistant|>\n")[1].split("<eos>")[0]
    assert ByteCallParser().parse(turn, TOOLS).calls == (ToolCall("lookup", {"key": "ab"}),)
    assert "<|tool|>\nxyz<eos><|assistant|>\n" in text


def test_auto_picks_the_parser_of_the_template(tmp_path: Path) -> None:
    assert isinstance(tool_call_parser(ByteTokenizer()), ByteCallParser)
    qwen = HFTokenizer.from_folder(build_model_folder(tmp_path / "q", "qwen3", weights=False))
    llama = HFTokenizer.from_folder(build_model_folder(tmp_path / "l", "llama", weights=False))
    assert isinstance(tool_call_parser(qwen), HermesParser)
    assert isinstance(tool_call_parser(llama), Llama3JsonParser)
    assert isinstance(tool_call_parser(qwen, "byte"), ByteCallParser)
