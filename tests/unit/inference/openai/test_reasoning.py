"""A chat choice's reasoning split off into `reasoning_content` by the endpoint's reply
builder, and its tool calls read from the answer only (no server, no model: the pieces
an engine would stream are given as they come)."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.inference.engine import Completion
from tidal.inference.openai.protocol import parse_chat
from tidal.inference.openai.server import OpenAIEndpoint, _Reply
from tidal.text.byte import ByteTokenizer

TOK = ByteTokenizer()
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up a key",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}
TEXT = '<think>maybe <call>lookup {"key": "a"}</call>?</think>\n<call>lookup {"key": "b"}</call>'


def _reply(**body: Any) -> _Reply:
    endpoint = OpenAIEndpoint(None, TOK, model_name="m", reasoning="think")  # type: ignore[arg-type]
    parsed = parse_chat({"messages": [{"role": "user", "content": "k?"}], **body}, TOK)
    return _Reply(endpoint, parsed, chat=True)


def _pieces(text: str, size: int) -> list[Completion]:
    starts = range(0, len(text), size)
    return [
        Completion(
            0, [], [], [], [], "stop" if at + size >= len(text) else None, text=text[at : at + size]
        )
        for at in starts
    ]


@pytest.mark.parametrize("size", [len(TEXT), 1, 5])
def test_calls_come_from_the_answer_and_the_reasoning_is_reasoning_content(size: int) -> None:
    reply = _reply(tools=[LOOKUP])
    stream = size < len(TEXT)
    key = "delta" if stream else "message"
    choices = [reply._choice(c, stream=stream) for c in _pieces(TEXT, size)]
    messages = [choice[key] for choice in choices]
    reasoning = "".join(m.get("reasoning_content") or "" for m in messages)
    assert reasoning == 'maybe <call>lookup {"key": "a"}</call>?'
    calls = [call for m in messages for call in m.get("tool_calls") or []]
    assert [call["function"]["arguments"] for call in calls] == ['{"key": "b"}']
    assert "".join(m.get("content") or "" for m in messages) == ""
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_without_a_block_the_whole_text_is_content() -> None:
    (choice,) = [_reply()._choice(c, stream=False) for c in _pieces("just 42", 100)]
    assert choice["message"] == {
        "role": "assistant",
        "content": "just 42",
        "reasoning_content": None,
    }
