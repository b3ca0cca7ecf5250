"""A call's choices as OpenAI's chat.completion: whole, every choice with its index, and
streamed, each choice's chunks carrying its index, usage and `[DONE]` last."""

from __future__ import annotations

import json

from tidal.orchestrator.completions import Completion
from tidal.orchestrator.gateway.chat_reply import ChatReply, ChoiceReply
from tidal.text.tool_calls import ParsedTurn


def _reply() -> ChatReply:
    choices = tuple(
        ChoiceReply(Completion(i, (65 + i, 0), (-0.1, -0.2), (3, 3), True), ParsedTurn(text))
        for i, text in enumerate(["A", "B"])
    )
    return ChatReply("tidal", choices, tuple(c.message() for c in choices), prompt_tokens=5)


def test_a_whole_reply_holds_every_choice_and_counts_their_tokens() -> None:
    body = _reply().whole()
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [
        (0, "A"),
        (1, "B"),
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert body["choices"][1]["tidal"] == {"token_ids": [66, 0], "policy_versions": [3, 3]}


def test_a_streamed_reply_sends_each_choice_under_its_index_then_usage_and_done() -> None:
    lines = b"".join(_reply().chunks(include_usage=True)).decode().split("\n\n")
    assert lines[-2:] == ["data: [DONE]", ""]
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
    content = {0: "", 1: ""}
    finished = {}
    for event in events[:-1]:
        (choice,) = event["choices"]
        content[choice["index"]] += choice["delta"].get("content", "")
        if choice.get("finish_reason"):
            finished[choice["index"]] = choice["finish_reason"]
    assert content == {0: "A", 1: "B"} and finished == {0: "stop", 1: "stop"}
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
