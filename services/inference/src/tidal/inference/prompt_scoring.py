"""Scoring a request's prompt tokens in the native engine's extend forward.

A request that asks for prompt logprobs holds a `ScoreBuffer` with one slot per scored
position; each extend chunk fills the slots of the positions it computed, by index, so a
prefill that is chunked, or preempted and recomputed, fills every slot exactly (a
recompute overwrites with the same values). The logits of position p score token p + 1,
so positions before `start - 1` are never needed: the scheduler may serve them from the
prefix cache. Rows go through the LM head in slices so a long prompt never holds a
(T, V) fp32 block at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tidal.inference.engine import TokenScores

_ROWS_PER_SLICE = 256  # (256, V) fp32 logits at a time: 50 MB at a 49k vocabulary


@dataclass(eq=False)
class ScoreBuffer:
    """Slots for `tokens[start:]`: logprob, rank, top-k and the version that scored each."""

    start: int
    count: int
    top_k: int
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logprobs = [0.0] * self.count
        self.ranks = [0] * self.count
        self.top_ids = [[] for _ in range(self.count)]
        self.top_logprobs = [[] for _ in range(self.count)]
        self.versions = [-1] * self.count

    def positions(self, start: int, end: int, prompt_len: int) -> range:
        """Of the computed positions `[start, end)`, those whose logits score a slot."""
        return range(max(start, self.start - 1), min(end, prompt_len - 1))

    def result(self) -> TokenScores:
        return TokenScores(
            start=self.start,
            logprobs=list(self.logprobs),
            ranks=list(self.ranks),
            top_ids=[list(t) for t in self.top_ids],
            top_logprobs=[list(t) for t in self.top_logprobs],
            policy_versions=list(self.versions),
        )


def fill_scores(
    buffer: ScoreBuffer,
    lm_head: torch.nn.Module,
    hidden: torch.Tensor,  # (R, dim) hidden states of positions `positions`
    positions: range,
    targets: torch.Tensor,  # (R,) long: the token at each position + 1
    version: int,
) -> None:
    """Score `targets` from the hidden states of the positions before them into `buffer`."""
    for lo in range(0, len(positions), _ROWS_PER_SLICE):
        hi = min(lo + _ROWS_PER_SLICE, len(positions))
        logprobs = torch.log_softmax(lm_head(hidden[lo:hi]).float(), dim=-1)  # (r, V)
        chosen = logprobs.gather(-1, targets[lo:hi, None])  # (r, 1)
        ranks = (logprobs > chosen).sum(-1) + 1  # (r,)
        k = buffer.top_k
        first = positions[lo] + 1 - buffer.start  # positions are consecutive: so are slots
        slots = slice(first, first + hi - lo)
        buffer.logprobs[slots] = chosen[:, 0].tolist()
        buffer.ranks[slots] = ranks.tolist()
        buffer.versions[slots] = [version] * (hi - lo)
        if k > 0:
            top = logprobs.topk(k, dim=-1)  # (r, k) values and indices, most likely first
            buffer.top_ids[slots] = top.indices.tolist()
            buffer.top_logprobs[slots] = top.values.tolist()
