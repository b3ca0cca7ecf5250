"""The policy's turn as an OpenAI chat.completion, whole or as server-sent chunks.

The turn is generated whole before the reply starts (its ids must be recorded first), so a
streamed reply is the same message cut into the chunks OpenAI clients expect: the role and
content, one delta per tool call, then the finish reason (and usage when asked). Each reply
carries the `"tidal"` extension of the inference endpoint (token ids, policy versions).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tidal.orchestrator.completions import Completion
from tidal.text.tool_calls import ParsedTurn, ToolCall


@dataclass(frozen=True)
class TurnReply:
    """One call's answer: the assistant message and what produced it."""

    model: str
    turn: Completion
    parsed: ParsedTurn
    prompt_tokens: int
    token_texts: tuple[str, ...] | None = None
    """Each sampled token's text when the agent asked for logprobs."""

    def message(self) -> dict[str, Any]:
        calls = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in self.parsed.calls
            if isinstance(c, ToolCall)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": self.parsed.content}
        if calls:
            message["tool_calls"] = calls
            message["content"] = self.parsed.content or None
        return message

    def key_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """The reply as `chat_request.message_key` reads an echoed message."""
        calls = [
            {"function": {"name": c["function"]["name"], "arguments": json.loads(a)}}
            for c in message.get("tool_calls", [])
            if (a := c["function"]["arguments"]) is not None
        ]
        return {"role": "assistant", "content": message["content"] or "", "tool_calls": calls}

    @property
    def finish_reason(self) -> str:
        if not self.turn.stopped:
            return "length"
        return "tool_calls" if any(isinstance(c, ToolCall) for c in self.parsed.calls) else "stop"

    def _usage(self) -> dict[str, int]:
        completion = len(self.turn.token_ids)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def _logprobs(self) -> dict[str, Any] | None:
        if self.token_texts is None:
            return None
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(self.token_texts, self.turn.logprobs, strict=True)
            ]
        }

    def _header(self, kind: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
        }

    def _extension(self) -> dict[str, Any]:
        return {
            "token_ids": list(self.turn.token_ids),
            "policy_versions": list(self.turn.policy_versions),
        }

    def whole(self, message: dict[str, Any]) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": self.finish_reason,
            "logprobs": self._logprobs(),
            "tidal": self._extension(),
        }
        return {**self._header("chat.completion"), "choices": [choice], "usage": self._usage()}

    def chunks(self, message: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
        """The SSE lines of a streamed reply, `[DONE]` last."""
        header = self._header("chat.completion.chunk")

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            return f"data: {json.dumps({**header, 'choices': choices, **extra})}\n\n".encode()

        first = {"role": "assistant", "content": message["content"] or ""}
        yield event([{"index": 0, "delta": first, "logprobs": self._logprobs()}])
        for i, call in enumerate(message.get("tool_calls", [])):
            yield event([{"index": 0, "delta": {"tool_calls": [{"index": i, **call}]}}])
        last = {"index": 0, "delta": {}, "finish_reason": self.finish_reason}
        yield event([{**last, "tidal": self._extension()}])
        if include_usage:
            yield event([], usage=self._usage())
        yield b"data: [DONE]\n\n"
