"""Rank 0 hands each micro-batch to its labelled rank; equal counts by zero-loss top-ups."""

from __future__ import annotations

import pytest
import torch

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.trainer.parallel.assign import shares_by_rank


def batch(*lengths: int, rank: int = 0) -> MicroBatchData:
    sample_lengths = torch.tensor(lengths)
    t = int(sample_lengths.sum())
    return MicroBatchData(
        input_ids=torch.zeros(t, dtype=torch.long),
        position_ids=positions_for(sample_lengths),
        sample_lengths=sample_lengths,
        loss_mask=torch.ones(t),
        advantages=torch.zeros(t),
        behaviour_logprobs=torch.zeros(t),
        rank=rank,
    )


def test_each_micro_batch_goes_to_its_labelled_rank_in_order() -> None:
    batches = [batch(100, rank=1), batch(60, rank=0), batch(50, rank=1), batch(10, rank=0)]
    shares = shares_by_rank(batches, 2)
    assert [[b.num_tokens for b in s] for s in shares] == [[60, 10], [100, 50]]


def test_ranks_with_fewer_batches_get_zero_loss_batches() -> None:
    shares = shares_by_rank([batch(30), batch(20, rank=1), batch(5)], 2)
    assert [[b.num_tokens for b in s] for s in shares] == [[30, 5], [20, 2]]
    filler = shares[1][1]
    assert filler.num_loss_tokens == 0 and filler.sample_lengths.tolist() == [2]


def test_a_rank_without_micro_batches_still_runs_every_pass() -> None:
    """A sender that labels everything rank 0 (an unset rank) still keeps ranks in step."""
    shares = shares_by_rank([batch(8), batch(4)], 3)
    assert [len(s) for s in shares] == [2, 2, 2]
    assert [sum(b.num_loss_tokens for b in s) for s in shares] == [12, 0, 0]


def test_a_rank_outside_the_degree_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rank 2 is outside \[0, 2\)"):
        shares_by_rank([batch(8, rank=2)], 2)
