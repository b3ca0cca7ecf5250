"""How a step's per-token losses are summed: per-token weights from the step's global counts.

Every loss is Σ_t w_t · ℓ_t with weights that depend only on the step's data, never on
which micro-batch or rank holds a token, so summing micro-batch losses (gradient
accumulation) gives the step loss exactly however the samples were split. The counts
are taken once per step before any forward; across ranks the caller's `reduce` sums
them (this module needs no process group). They come from `loss_mask`, not from
trust-region masking, which depends on the current weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from tidal.batch.tensors import MicroBatchData, segment_ids

Normalization = Literal["token", "sequence", "constant"]
Reduce = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StepCounts:
    """Global denominators of one step (summed over micro-batches and ranks)."""

    loss_tokens: int
    sequences: int  # samples with at least one loss token


def _per_sample_loss_tokens(batch: MicroBatchData) -> torch.Tensor:
    """(S,) number of loss tokens in each sample of the micro-batch."""
    segment = segment_ids(batch.sample_lengths)  # (T,)
    counts = torch.zeros(batch.sample_lengths.shape[0], dtype=batch.loss_mask.dtype)
    return counts.index_add_(0, segment.to(counts.device), batch.loss_mask.cpu())


def step_counts(batches: Sequence[MicroBatchData], reduce: Reduce | None = None) -> StepCounts:
    """The step's loss-token and sequence counts; `reduce` sums them across ranks."""
    local = torch.zeros(2, dtype=torch.float64)
    for batch in batches:
        per_sample = _per_sample_loss_tokens(batch)  # (S,)
        local[0] += per_sample.sum()
        local[1] += (per_sample > 0).sum()
    total = reduce(local) if reduce is not None else local
    return StepCounts(loss_tokens=int(total[0].item()), sequences=int(total[1].item()))


def segment_sum(values: torch.Tensor, segments: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Sum of `values` (N,) within each segment: → (num_segments,), differentiable."""
    out = torch.zeros(num_segments, dtype=values.dtype, device=values.device)
    return out.index_add(0, segments, values)


def token_weights(
    loss_mask: torch.Tensor,  # (N,) 1.0 for loss tokens
    segments: torch.Tensor,  # (N,) int64 sample index of each token
    num_segments: int,
    *,
    norm: Normalization,
    counts: StepCounts,
    constant: float | None = None,
) -> torch.Tensor:
    """(N,) weights w_t, zero off the mask, such that the step loss is Σ_t w_t · ℓ_t."""
    if counts.loss_tokens <= 0:
        raise ValueError("the step has no loss tokens; there is nothing to normalize by")
    if norm == "token":
        return loss_mask / counts.loss_tokens
    if norm == "sequence":
        per_sample = segment_sum(loss_mask, segments, num_segments)  # (S,) loss tokens each
        tokens_in_sample = per_sample[segments].clamp(min=1.0)  # (N,)
        return loss_mask / (tokens_in_sample * counts.sequences)
    if norm == "constant":
        if constant is None or constant <= 0:
            raise ValueError(f"norm 'constant' needs a positive constant, got {constant!r}")
        return loss_mask / constant
    raise ValueError(f"unknown normalization {norm!r}; supported: token, sequence, constant")
