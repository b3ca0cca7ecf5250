"""`tools`, `tool_choice` and tool messages of a chat body → the rendered prompt, or a 400
naming the field (no server, no model)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tidal.common.errors import InvalidArgument
from tidal.inference.config import RequestLimits
from tidal.inference.openai.protocol import parse_chat
from tidal.inference.openai.tool_schemas import schema_problem
from tidal.inference.openai.tools import json_size_over
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer

from ....hf_folders import qwen3_folder

__all__ = ["qwen3_folder"]

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up a key",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}
ASK = {"role": "user", "content": "What is k?"}
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"key": "k"}'},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "42"}


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [ASK], **fields}


def test_tools_and_the_tool_turns_render_through_the_template() -> None:
    tok = ByteTokenizer()
    parsed = parse_chat(chat(messages=[ASK, CALLED, RESULT], tools=[LOOKUP]), tok)
    text = tok.decode(parsed.prompt_ids, skip_special=False)
    assert text == (
        "<bos><|tools|>\nlookup: Look up a key\n<eos><|user|>\nWhat is k?<eos>"
        '<|assistant|>\n<call>lookup {"key": "k"}</call><eos><|tool|>\n42<eos><|assistant|>\n'
    )
    assert parsed.tools.parse_calls


def test_a_hermes_template_gets_the_tools_and_the_call_arguments_as_objects(
    qwen3_folder: Path,
) -> None:
    tok = HFTokenizer.from_folder(qwen3_folder)
    parsed = parse_chat(chat(messages=[ASK, CALLED, RESULT], tools=[LOOKUP]), tok)
    text = tok.decode(parsed.prompt_ids, skip_special=False)
    assert json.dumps(LOOKUP) in text and "<tool_response>\n42\n</tool_response>" in text


def test_tool_choice_none_shows_the_tools_but_reads_no_calls() -> None:
    tok = ByteTokenizer()
    parsed = parse_chat(chat(tools=[LOOKUP], tool_choice="none"), tok)
    assert "lookup: Look up a key" in tok.decode(parsed.prompt_ids)
    assert not parsed.tools.parse_calls
    assert not parse_chat(chat(), tok).tools.parse_calls


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": {"lookup": {}}}, "tools"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        ({"tools": [LOOKUP, LOOKUP]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"$ref": "http://x/s.json"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tools": [LOOKUP], "tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [LOOKUP], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": [LOOKUP], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [LOOKUP], "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
        (
            {
                "messages": [
                    ASK,
                    {**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]},
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"messages": [ASK, {**CALLED, "tool_calls": "x"}]}, "messages[1].tool_calls"),
        ({"messages": [ASK, {**RESULT, "tool_call_id": 7}]}, "messages[1].tool_call_id"),
    ],
)
def test_bad_tool_fields_are_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    try:
        tools = parse_chat(chat(**fields), ByteTokenizer()).tools
    except InvalidArgument as e:
        assert e.field == param, e
        return
    problem = schema_problem(tools.tools)  # what the server's worker process runs
    assert problem is not None and problem[0] == param, problem


@pytest.mark.parametrize(
    ("limits", "tools", "says"),
    [
        (RequestLimits(max_tools=2), [LOOKUP] * 3, "inference.limits.max_tools"),
        (
            RequestLimits(max_tools_bytes=1000),
            [{**LOOKUP, "function": {**LOOKUP["function"], "description": "x" * 2000}}],
            "inference.limits.max_tools_bytes",
        ),
        # a schema nested past any recursion limit is refused by size, before it is walked
        (RequestLimits(max_tools_bytes=1000), [{"a": [[[[]]]] * 10**6}], "max_tools_bytes"),
    ],
)
def test_too_many_or_too_large_tools_are_refused_before_any_is_looked_at(
    limits: RequestLimits, tools: list[Any], says: str
) -> None:
    with pytest.raises(InvalidArgument, match=says) as caught:
        parse_chat(chat(tools=tools), ByteTokenizer(), limits)
    assert caught.value.field == "tools"


def test_duplicate_names_are_found_in_one_pass() -> None:
    many = [{"type": "function", "function": {"name": f"t{i}"}} for i in range(20_000)]
    started = time.perf_counter()
    with pytest.raises(InvalidArgument) as caught:
        limits = RequestLimits(max_tools=30_000, max_tools_bytes=1 << 30)
        parse_chat(chat(tools=[*many, many[5]]), ByteTokenizer(), limits)
    assert caught.value.field == "tools[20000].function.name"
    assert time.perf_counter() - started < 2.0  # quadratic: minutes


def test_json_size_over_stops_at_the_budget() -> None:
    assert not json_size_over({"a": ["b", 1]}, 100)
    assert json_size_over({"a": "b" * 100}, 100)
    assert json_size_over([[]] * 10**7, 1000)


def test_the_tools_count_toward_the_prompt_size_limit() -> None:
    big = {**LOOKUP, "function": {**LOOKUP["function"], "description": "x" * 5000}}
    with pytest.raises(InvalidArgument, match=r"^messages: "):
        parse_chat(chat(tools=[big]), ByteTokenizer(), RequestLimits(max_prompt_bytes=4096))
