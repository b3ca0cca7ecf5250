"""Each data-parallel rank's micro-batches of a step, as the sender labelled them.

The sender's split (`tidal.batch.balance`) is the only one: rank 0 hands every
micro-batch to its `rank`. Every rank must run the same number of forward/backward
passes, because each FSDP unit all-gathers and reduce-scatters in every pass, so a rank
with fewer micro-batches (none, from a sender that labels everything rank 0) is topped
up with two-token zero-loss batches, whose gradient is 0.
"""

from __future__ import annotations

import torch

from tidal.batch.tensors import MicroBatchData


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


def shares_by_rank(batches: list[MicroBatchData], ranks: int) -> list[list[MicroBatchData]]:
    """The micro-batches of each rank in [0, ranks), equal in count (zero-loss top-ups)."""
    outside = [b.rank for b in batches if not 0 <= b.rank < ranks]
    if outside:
        raise ValueError(f"micro-batch rank {outside[0]} is outside [0, {ranks})")
    shares: list[list[MicroBatchData]] = [[] for _ in range(ranks)]
    for batch in batches:
        shares[batch.rank].append(batch)
    count = max(len(s) for s in shares)
    return [share + [zero_loss_batch() for _ in range(count - len(share))] for share in shares]
