"""The policy's turns as an OpenAI chat.completion, whole or as server-sent chunks.

A call's turns (one per choice, `n` of them) are generated whole before the reply starts
(their ids must be recorded first, and inference returns each completion whole), so a
streamed reply is the same choices cut into the chunks OpenAI clients expect, choice by
choice: the role and content, one delta per tool call, then the finish reason (and usage
when asked, last). Each choice carries the `"tidal"` extension of the inference endpoint
(token ids, policy versions).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from tidal.orchestrator.completions import Completion
from tidal.text.tool_calls import ParsedTurn, ToolCall


@dataclass(frozen=True)
class ChoiceReply:
    """One choice of a call: the sampled turn, what the parser made of it, its message."""

    turn: Completion
    parsed: ParsedTurn
    token_texts: tuple[str, ...] | None = None
    """Each sampled token's text when the agent asked for logprobs."""

    def message(self) -> dict[str, Any]:
        calls = [
            {
                "id": f"call_{secrets.token_hex(12)}",
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

    @staticmethod
    def key_message(message: dict[str, Any]) -> dict[str, Any]:
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

    def _logprobs(self) -> dict[str, Any] | None:
        if self.token_texts is None:
            return None
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(self.token_texts, self.turn.logprobs, strict=True)
            ]
        }

    def _extension(self) -> dict[str, Any]:
        return {
            "token_ids": list(self.turn.token_ids),
            "policy_versions": list(self.turn.policy_versions),
        }

    def whole(self, index: int, message: dict[str, Any]) -> dict[str, Any]:
        return {
            "index": index,
            "message": message,
            "finish_reason": self.finish_reason,
            "logprobs": self._logprobs(),
            "tidal": self._extension(),
        }

    def deltas(self, index: int, message: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The choice's streamed pieces, each the one choice of a chunk."""
        first = {"role": "assistant", "content": message["content"] or ""}
        yield {"index": index, "delta": first, "logprobs": self._logprobs()}
        for i, call in enumerate(message.get("tool_calls", [])):
            yield {"index": index, "delta": {"tool_calls": [{"index": i, **call}]}}
        last = {"index": index, "delta": {}, "finish_reason": self.finish_reason}
        yield {**last, "tidal": self._extension()}


@dataclass(frozen=True)
class ChatReply:
    """One call's answer: its choices and the messages they became."""

    model: str
    choices: tuple[ChoiceReply, ...]
    messages: tuple[dict[str, Any], ...]
    """The assistant message of each choice, in order (as recorded in the trace)."""
    prompt_tokens: int

    def _usage(self) -> dict[str, int]:
        completion = sum(len(c.turn.token_ids) for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def _header(self, kind: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{secrets.token_hex(16)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
        }

    def whole(self) -> dict[str, Any]:
        choices = [
            c.whole(i, m) for i, (c, m) in enumerate(zip(self.choices, self.messages, strict=True))
        ]
        return {**self._header("chat.completion"), "choices": choices, "usage": self._usage()}

    def chunks(self, *, include_usage: bool) -> Iterator[bytes]:
        """The SSE lines of a streamed reply, `[DONE]` last."""
        header = self._header("chat.completion.chunk")

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            return b"data: " + orjson.dumps({**header, "choices": choices, **extra}) + b"\n\n"

        for i, (choice, message) in enumerate(zip(self.choices, self.messages, strict=True)):
            for delta in choice.deltas(i, message):
                yield event([delta])
        if include_usage:
            yield event([], usage=self._usage())
        yield b"data: [DONE]\n\n"
