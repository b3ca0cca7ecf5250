"""The streaming tool-call splitter: exact generated texts, split into pieces every way."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.inference.openai.tool_call_stream import ToolCallStream
from tidal.text.tool_calls import ByteCallParser, HermesParser, Llama3JsonParser, ToolCallParser

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a key",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]
HERMES = HermesParser()


def pushed(
    parser: ToolCallParser, pieces: list[str]
) -> tuple[list[str], list[tuple[int, str, dict[str, Any]]]]:
    """The content sent per piece and every call (index, name, arguments) in order."""
    stream = ToolCallStream(parser, TOOLS)
    contents, calls = [], []
    for i, piece in enumerate(pieces):
        content, done = stream.push(piece, last=i == len(pieces) - 1)
        contents.append(content)
        calls += [(c.index, c.call.name, c.call.arguments) for c in done]
    return contents, calls


def every_split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def assert_streams_like_whole(parser: ToolCallParser, text: str) -> tuple[str, list[Any]]:
    """Pieces of any size join to what one push of the whole text gives; returns that."""
    (whole,), calls = pushed(parser, [text])
    for size in (1, 2, 3, 7):
        contents, streamed_calls = pushed(parser, every_split(text, size))
        assert ("".join(contents), streamed_calls) == (whole, calls), size
    return whole, calls


def test_a_call_split_across_many_pieces_is_one_call() -> None:
    text = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'
    contents, calls = pushed(HERMES, every_split(text, 1))
    assert calls == [(0, "lookup", {"key": "alpha"})]
    assert contents == [""] * len(contents)


def test_two_calls_get_indexes_0_and_1_and_the_blank_between_them_is_dropped() -> None:
    text = (
        '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>\n'
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>\n'
    )
    content, calls = assert_streams_like_whole(HERMES, text)
    assert content == ""
    assert calls == [(0, "lookup", {"key": "a"}), (1, "now", {})]


def test_text_before_a_call_is_content_streamed_before_the_call_ends() -> None:
    text = 'Let me look.\n<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>'
    content, calls = assert_streams_like_whole(HERMES, text)
    assert content == "Let me look." and calls == [(0, "lookup", {"key": "k"})]
    contents, _ = pushed(HERMES, ["Let me look.\n<tool", "_call>{", text.split("{", 1)[1]])
    assert contents == ["Let me look.", "", ""]  # the blank before the call is held


def test_a_marker_prefix_that_is_no_call_is_held_then_sent_as_content() -> None:
    contents, calls = pushed(HERMES, ["a <tool", "box> b <tool_c", "ar"])
    assert contents == ["a", " <toolbox> b", " <tool_car"] and calls == []


def test_a_turn_without_calls_is_its_text_exactly() -> None:
    text = "  Hello,\n\nworld <b>bold</b> < 3  \n"
    content, calls = assert_streams_like_whole(HERMES, text)
    assert content == text and calls == []


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',  # not a declared tool
        '<tool_call>{"name": "lookup", "arguments": {"key": 3}}</tool_call>',  # off-schema
        '<tool_call>{"name": "lookup", "arguments": {"key": "k"}}',  # never closed
    ],
)
def test_a_call_that_cannot_run_stays_content_where_it_was(bad: str) -> None:
    text = f"Trying. {bad} Done."
    if not bad.endswith("</tool_call>"):
        text = f"Trying. {bad}"
    content, calls = assert_streams_like_whole(HERMES, text)
    assert content == text and calls == []


def test_a_bad_call_beside_a_good_one_is_content_and_the_good_one_a_call() -> None:
    good = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    content, calls = assert_streams_like_whole(HERMES, f"<tool_call>oops</tool_call>\n{good}")
    assert content == "<tool_call>oops</tool_call>" and calls == [(0, "now", {})]


def test_the_byte_format_streams_the_same_way() -> None:
    text = 'ok <call>lookup {"key": "b"}</call><call>now {}</call>'
    content, calls = assert_streams_like_whole(ByteCallParser(), text)
    assert content == "ok" and calls == [(0, "lookup", {"key": "b"}), (1, "now", {})]


def test_llama3_json_holds_a_turn_that_opens_with_a_brace_and_parses_it_at_the_end() -> None:
    text = '{"name": "lookup", "parameters": {"key": "c"}}; {"name": "now", "parameters": {}}'
    content, calls = assert_streams_like_whole(Llama3JsonParser(), text)
    assert content == "" and calls == [(0, "lookup", {"key": "c"}), (1, "now", {})]
    contents, _ = pushed(Llama3JsonParser(), [text[:10], text[10:]])
    assert contents == ["", ""]


def test_llama3_json_streams_prose_as_soon_as_it_is_not_a_call() -> None:
    contents, calls = pushed(Llama3JsonParser(), ["  ", "The", " answer {is} 4"])
    assert contents == ["", "  The", " answer {is} 4"] and calls == []
    assert assert_streams_like_whole(Llama3JsonParser(), "{broken")[0] == "{broken"


def test_a_call_whose_schema_cannot_be_resolved_stays_content() -> None:
    dangling = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert ToolCallStream(HERMES, [dangling]).push(text, last=True) == (text, [])


def test_each_call_has_its_own_id() -> None:
    stream = ToolCallStream(HERMES, TOOLS)
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    _, calls = stream.push(call * 3, last=True)
    ids = [c.id for c in calls]
    assert len(set(ids)) == 3 and all(i.startswith("call_") for i in ids)
