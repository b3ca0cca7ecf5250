"""One sequence being generated: its slot, its tokens so far, and when it has to stop.

Decisions:
- A sequence is one of the n samples of a request. It knows nothing of batches: the
  engine puts it into whichever step runs next, and its tokens depend only on its own
  seed (a fixed vector of uniforms) and its logits.
- A sequence's budget is min(max_tokens, max_seq_len - prompt length): prompt plus
  completion never exceeds the model's context, which is also what the trainer can
  train on.
- Stop tokens and stop strings end a sequence at the token that produced them, and that
  token is kept (with its logprob), so the tokens, logprobs and version tags always line
  up and the trainer sees exactly what was sampled. Stop strings are matched on the
  completion's text as it grows (`completion_text.CompletionText`: incremental
  detokenization, O(1) amortized per token), so a stop string spanning several tokens,
  a BPE merge or a character split over tokens is found at the token completing it.
- EOS is not special here: the servicer adds the tokenizer's EOS ids to
  `stop_token_ids` unless the request sets `ignore_eos`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tidal.inference.completion_text import CompletionText
from tidal.inference.engine import FinishReason
from tidal.inference.sampling import SamplingParams


def sequence_budget(prompt_len: int, max_tokens: int, max_seq_len: int) -> int:
    """New tokens a sequence may generate: max_tokens, cut to what the context leaves."""
    return max(0, min(max_tokens, max_seq_len - prompt_len))


@dataclass(eq=False)
class Sequence:
    """One sample of one request, from admission until it finishes."""

    owner: Any
    """The engine's request this sample belongs to."""
    index: int
    """Which of the request's n samples this is."""
    prompt_ids: list[int]
    params: SamplingParams
    uniforms: torch.Tensor  # (budget,) float64: the draw of each step (unused when greedy)
    budget: int
    text: CompletionText | None = None
    """The completion's text; None for an engine without a tokenizer (ids only)."""
    slot: int = -1
    blocks: list[int] = field(default_factory=list)
    """Block table in the paged KV cache (empty with the slot cache)."""
    computed: int = 0
    """Paged cache only: positions whose keys and values are cached."""
    prefix_cacheable: bool = True
    """Paged cache only: whether its full blocks may enter the prefix cache (False once
    new weights arrive mid-sequence: its keys mix versions)."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    sent: int = 0
    """Tokens already streamed to the caller."""

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def position(self) -> int:
        """Cache position of the last token, the one the next decode step feeds."""
        return len(self.prompt_ids) + len(self.token_ids) - 1

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by the completion so far."""
        return self.prompt_ids + self.token_ids

    def append(self, token: int, logprob: float, model_logprob: float | None, version: int) -> None:
        """Record one sampled token and decide whether the sequence ends with it."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if model_logprob is not None:
            self.model_logprobs.append(model_logprob)
        self.policy_versions.append(version)
        hit_stop_string = self.text is not None and self.text.push(token)
        if token in self.params.stop_token_ids or hit_stop_string:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.budget:
            self.finish_reason = "length"
        if self.done and self.text is not None:
            self.text.finish()

    def take_text(self) -> str:
        """The text since the previous call ("" without a tokenizer)."""
        return "" if self.text is None else self.text.take()
