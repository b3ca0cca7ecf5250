"""An agent episode's calls as trajectories: a call that repeats the history and the reply
extends it (only the new messages' ids appended, mask 0), whatever fields the client adds
to its echo; any other history, or other tools, starts a new sample; each of a call's n
choices is a sample, and a later call extends the one it echoes; a refused call leaves
nothing behind."""

from __future__ import annotations

from typing import Any

from tidal.orchestrator.completions import Completion
from tidal.orchestrator.gateway.chat_reply import ChoiceReply
from tidal.orchestrator.gateway.chat_request import message_key, parse_chat_call
from tidal.orchestrator.gateway.trace import EpisodeTrace, RecordedTurn
from tidal.text.byte import ByteTokenizer
from tidal.text.conversation import ChatRendering
from tidal.text.tool_calls import tool_call_parser

TOK = ByteTokenizer()
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
ASK = {"role": "user", "content": "a"}


def call(
    trace: EpisodeTrace, messages: list[dict[str, Any]], *texts: str, tools: Any = TOOLS
) -> dict[str, Any]:
    """One call: its prompt, a 'sampled' turn of each text's ids (its choices), and the
    first choice's reply message."""
    parsed_call = parse_chat_call({"messages": messages, "tools": tools, "n": len(texts)})
    pending = trace.prompt(parsed_call.messages, parsed_call.keys, parsed_call.tools)
    recorded, replies = [], []
    for text in texts:
        ids = (*TOK.encode(text, add_special_tokens=False), TOK.eos_id)
        turn = Completion(0, ids, tuple(-0.5 for _ in ids), tuple(7 for _ in ids), True)
        parsed = tool_call_parser(TOK, "auto").parse(text, parsed_call.tools)
        choice = ChoiceReply(turn, parsed)
        message = choice.message()
        recorded.append(RecordedTurn(turn, text, parsed, message_key(choice.key_message(message))))
        replies.append(message)
    trace.record(pending, recorded)
    return replies[0] if len(replies) == 1 else {"choices": replies}


def test_a_chat_loop_is_one_sample_with_the_tool_message_masked() -> None:
    trace = EpisodeTrace(ChatRendering(TOK, True))
    reply = call(trace, [ASK], '<call>lookup {"key": "a"}</call>')
    echoed = {**reply, "refusal": None, "audio": None}  # what a client adds when echoing
    echoed["tool_calls"] = [
        {**c, "function": {**c["function"], "arguments": ' {"key" : "a"} '}}
        for c in reply["tool_calls"]
    ]
    tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "b"}
    call(trace, [ASK, echoed, tool], "b")
    (sample,) = trace.samples()
    tail = TOK.decode(
        [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m == 0],
        skip_special=False,
    )
    assert tail == "<|tool|>\nb<eos><|assistant|>\n"
    assert sample.turns == ('<call>lookup {"key": "a"}</call>', "b")
    assert sample.tools.calls == 1
    assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m == 0)
    assert len(sample.policy_versions) == sum(sample.loss_mask)


def test_a_rewritten_history_or_other_tools_start_new_samples() -> None:
    trace = EpisodeTrace(ChatRendering(TOK, True))
    reply = call(trace, [ASK], "x")
    call(trace, [ASK, {**reply, "content": "edited"}, ASK], "y")  # the reply was edited
    call(trace, [ASK], "z", tools=None)  # the same chat without tools
    assert len(trace.samples()) == 3


def test_a_refused_call_leaves_the_trajectory_as_it_was() -> None:
    trace = EpisodeTrace(ChatRendering(TOK, True))
    reply = call(trace, [ASK], "x")
    (before,) = trace.samples()
    parsed = parse_chat_call({"messages": [ASK, reply, ASK], "tools": TOOLS})
    pending = trace.prompt(parsed.messages, parsed.keys, parsed.tools)
    assert len(pending.ids) > len(before.prompt_ids) + len(before.token_ids)
    trace.undo(pending)
    (after,) = trace.samples()
    assert after == before
    call(trace, [ASK, reply, ASK], "y")  # and the next call extends it as if never refused
    assert len(trace.samples()) == 1


def test_each_choice_is_a_sample_and_the_chat_goes_on_from_the_one_echoed() -> None:
    trace = EpisodeTrace(ChatRendering(TOK, True))
    first = call(trace, [ASK], "x")
    question = {"role": "user", "content": "again"}
    choices = call(trace, [ASK, first, question], "p", "q", "r")["choices"]
    call(trace, [ASK, first, question, choices[1], question], "s")  # goes on from "q"
    main, second, third = trace.samples()
    assert main.turns == ("x", "p")  # the call's first choice extends the chat loop
    assert second.turns == ("q", "s") and third.turns == ("r",)
    # the other choices' prompt is the call's whole prompt: the earlier turn "x" is in it,
    # masked out, so no turn is trained twice
    assert second.prompt_ids == third.prompt_ids == main.prompt_ids + main.token_ids[:-2]
    assert second.loss_mask[:2] == (1.0, 1.0)
    assert [t.count("x") for t in (main.turns, second.turns, third.turns)] == [1, 0, 0]
