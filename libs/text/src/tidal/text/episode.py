"""Multi-turn episodes as ids + loss mask, without re-tokenization drift.

The invariant: ids already sent to the policy never change. The policy's ids are kept
verbatim (mask 1); environment turns are cut from the template's rendering of the whole
chat (mask 0). When a template re-renders earlier turns differently (Qwen3 drops old
`<think>` blocks), the new turns are cut at end-of-turn tokens instead and the earlier
ids stay, so the episode is what the policy saw, not a from-scratch rendering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidal.text.chat_template import PROBE_CHAT, first_after_assistant
from tidal.text.tokenizer import Message, Tokenizer


class EpisodeRenderError(ValueError):
    """A turn cannot be appended without changing ids the policy already saw."""


def end_of_turn(tokenizer: Tokenizer) -> tuple[str, int] | None:
    """The end-of-turn token (text, id) among `eos_ids`: the first one the chat template
    writes after an assistant message's content."""
    rendered = tokenizer.apply_chat_template(PROBE_CHAT, add_generation_prompt=False)
    by_text = {tokenizer.decode([i], skip_special=False): i for i in reversed(tokenizer.eos_ids)}
    token = first_after_assistant(rendered, by_text)
    return (token, by_text[token]) if token is not None else None


@dataclass
class Episode:
    """A growing multi-turn episode: `ids` with `loss_mask` 1 on the policy's tokens."""

    tokenizer: Tokenizer
    system_prompt: str | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def _render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            system_prompt=self.system_prompt,
            tools=self.tools,
            **self.template_kwargs,
        )

    def start(self, messages: Sequence[Message]) -> list[int]:
        """The first prompt: `messages` rendered with the generation prompt."""
        if self.ids:
            raise EpisodeRenderError("episode already started")
        self.messages = [dict(m) for m in messages]
        prompt = self.tokenizer.encode_template_text(
            self._render(self.messages, add_generation_prompt=True)
        )
        self._append(prompt, trained=False)
        return prompt

    def add_assistant(self, generated_ids: Sequence[int]) -> None:
        """The policy's turn, its ids verbatim (mask 1)."""
        if not self.ids:
            raise EpisodeRenderError("start the episode with its opening messages first")
        ids = list(generated_ids)
        self._append(ids, trained=True)
        content = self.tokenizer.decode(ids, skip_special=True)
        self.messages.append({"role": "assistant", "content": content})

    def add_messages(self, messages: Sequence[Message]) -> list[int]:
        """Environment turns (user/tool) and the next generation prompt; returns the new
        ids (mask 0), which is what the policy is sent to continue the episode."""
        new_messages = [dict(m) for m in messages]
        after = self._render([*self.messages, *new_messages], add_generation_prompt=True)
        held = self.tokenizer.decode(self.ids, skip_special=False)
        if after.startswith(held):
            new_text = after[len(held) :]
        else:
            before = self._render(self.messages, add_generation_prompt=False)
            new_text = self._new_text_by_turns(before, after)
        new_ids = self.tokenizer.encode_template_text(new_text)
        self._append(new_ids, trained=False)
        self.messages.extend(new_messages)
        return new_ids

    def _new_text_by_turns(self, before: str, after: str) -> str:
        eot = end_of_turn(self.tokenizer)
        if eot is None:
            raise EpisodeRenderError(
                f"{self.tokenizer.name}: the chat template re-renders earlier turns and has no "
                "end-of-turn token among eos_ids to split the new turns at"
            )
        token, token_id = eot
        closing = before[before.rfind(token) + len(token) :]
        cut = -1
        for _ in range(before.count(token)):
            cut = after.find(token, cut + 1)
            if cut < 0:
                raise EpisodeRenderError(
                    f"{self.tokenizer.name}: the new rendering has fewer {token!r} than the "
                    "episode's turns; cannot append without changing earlier ids"
                )
        start = cut + len(token)
        if not after.startswith(closing, start):
            raise EpisodeRenderError(
                f"{self.tokenizer.name}: the new rendering does not close the last turn with "
                f"{token + closing!r}"
            )
        new_text = after[start:]
        return new_text if self.ids[-1] == token_id else token + new_text

    def _append(self, ids: list[int], *, trained: bool) -> None:
        self.ids.extend(ids)
        self.loss_mask.extend([1 if trained else 0] * len(ids))
