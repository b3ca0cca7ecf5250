"""Rank 0's split of a step's micro-batches over the data-parallel ranks.

Decisions:
- Cost of a micro-batch is `tidal.batch.balance.batch_cost` (Σ over its samples of
  `L + L² / QUADRATIC_SCALE`), the cost model the orchestrator packs with, so both sides
  agree on what "balanced" means.
- Longest-processing-time first over whole micro-batches (`split_by_cost`, the same
  split the orchestrator makes over samples): the costliest goes to the rank with the
  least cost so far. Micro-batches are never cut: the orchestrator already packs
  rank-major, balanced micro-batches when `data_parallel_ranks` matches, and a re-pack
  here would change the step's packing (the loss is packing-invariant anyway).
- Every rank must run the same number of forward/backward passes, because each FSDP
  unit all-gathers and reduce-scatters in every pass: ranks with fewer micro-batches are
  topped up with a two-token zero-loss batch (loss_mask all 0), whose gradient is 0.
"""

from __future__ import annotations

import torch

from tidal.batch.balance import batch_cost, split_by_cost
from tidal.batch.tensors import MicroBatchData


def micro_batch_cost(batch: MicroBatchData) -> float:
    return batch_cost(batch.sample_lengths.tolist())


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
    shares = split_by_cost([micro_batch_cost(b) for b in batches], ranks)
    count = max(len(s) for s in shares)
    return [
        [batches[i] for i in sorted(share)] + [zero_loss_batch() for _ in range(count - len(share))]
        for share in shares
    ]
