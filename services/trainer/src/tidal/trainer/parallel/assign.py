"""Rank 0's split of a step's micro-batches over the data-parallel ranks.

Decisions:
- Cost of a micro-batch is Σ over its samples of `L + L² / QUADRATIC_SCALE` (linear: MLP
  and projections; quadratic: attention), as in tidal.batch.balance, so
  both sides agree on what "balanced" means.
- Longest-processing-time first over whole micro-batches: the costliest goes to the rank
  with the least cost so far. Micro-batches are never cut: the orchestrator already
  packs rank-major, balanced micro-batches when `data_parallel_ranks` matches, and a
  re-pack here would change the step's packing (the loss is packing-invariant anyway).
- Every rank must run the same number of forward/backward passes, because each FSDP
  unit all-gathers and reduce-scatters in every pass: ranks with fewer micro-batches are
  topped up with a two-token zero-loss batch (loss_mask all 0), whose gradient is 0.
"""

from __future__ import annotations

import torch

from tidal.batch.tensors import MicroBatchData

QUADRATIC_SCALE = 2048.0  # the orchestrator's value (tidal.batch.balance)


def micro_batch_cost(batch: MicroBatchData) -> float:
    lengths = batch.sample_lengths.double()  # (S,)
    return float((lengths + lengths * lengths / QUADRATIC_SCALE).sum())


def zero_loss_batch() -> MicroBatchData:
    """Two tokens of one sample with nothing to train on: keeps collectives in step."""
    zeros = torch.zeros(2)
    return MicroBatchData(
        input_ids=torch.zeros(2, dtype=torch.long),
        position_ids=torch.arange(2),
        sample_lengths=torch.tensor([2]),
        loss_mask=zeros,
        advantages=zeros.clone(),
        behaviour_logprobs=zeros.clone(),
    )


def assign_micro_batches(batches: list[MicroBatchData], ranks: int) -> list[list[MicroBatchData]]:
    """Micro-batches per rank, balanced by cost, equal in count (topped up with zero loss)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    costs = [micro_batch_cost(b) for b in batches]
    totals = [0.0] * ranks
    shares: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(batches)), key=lambda i: (-costs[i], i)):
        rank = min(range(ranks), key=lambda r: (totals[r], len(shares[r]), r))
        shares[rank].append(i)
        totals[rank] += costs[i]
    count = max(len(s) for s in shares)
    return [
        [batches[i] for i in sorted(share)] + [zero_loss_batch() for _ in range(count - len(share))]
        for share in shares
    ]
