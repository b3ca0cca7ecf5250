"""An agent episode's calls as trajectories: a call that repeats the history and the reply
extends it (only the new messages' ids appended, mask 0), whatever fields the client adds
to its echo; any other history, or other tools, starts a new sample; a refused call
leaves nothing behind."""

from __future__ import annotations

from typing import Any

from tidal.orchestrator.completions import Completion
from tidal.orchestrator.gateway.chat_reply import TurnReply
from tidal.orchestrator.gateway.chat_request import message_key, parse_chat_call
from tidal.orchestrator.gateway.trace import EpisodeTrace
from tidal.text.byte import ByteTokenizer
from tidal.text.conversation import ChatRendering
from tidal.text.tool_calls import tool_call_parser

TOK = ByteTokenizer()
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
ASK = {"role": "user", "content": "a"}


def call(
    trace: EpisodeTrace, messages: list[dict[str, Any]], text: str, tools: Any = TOOLS
) -> dict[str, Any]:
    """One call: its prompt, a 'sampled' turn of `text`'s ids, and the reply message."""
    parsed_call = parse_chat_call({"messages": messages, "tools": tools})
    pending = trace.prompt(parsed_call.messages, parsed_call.keys, parsed_call.tools)
    ids = (*TOK.encode(text, add_special_tokens=False), TOK.eos_id)
    turn = Completion(0, ids, tuple(-0.5 for _ in ids), tuple(7 for _ in ids), True)
    parsed = tool_call_parser(TOK, "auto").parse(text, parsed_call.tools)
    reply = TurnReply("m", turn, parsed, len(pending.ids))
    message = reply.message()
    trace.record(pending, turn, text, parsed, message_key(reply.key_message(message)))
    return message


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
