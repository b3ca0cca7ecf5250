"""Rank 0's split of micro-batches: balanced by cost, equal counts, zero-loss top-ups."""

from __future__ import annotations

import torch

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.trainer.parallel.assign import assign_micro_batches, micro_batch_cost


def batch(*lengths: int) -> MicroBatchData:
    sample_lengths = torch.tensor(lengths)
    t = int(sample_lengths.sum())
    return MicroBatchData(
        input_ids=torch.zeros(t, dtype=torch.long),
        position_ids=positions_for(sample_lengths),
        sample_lengths=sample_lengths,
        loss_mask=torch.ones(t),
        advantages=torch.zeros(t),
        behaviour_logprobs=torch.zeros(t),
    )


def test_costliest_batches_go_to_the_least_loaded_rank() -> None:
    batches = [batch(100), batch(60), batch(50), batch(10)]
    shares = assign_micro_batches(batches, 2)
    assert [[b.num_tokens for b in s] for s in shares] == [[100, 10], [60, 50]]


def test_attention_cost_is_quadratic_in_sample_length() -> None:
    assert micro_batch_cost(batch(1024)) > micro_batch_cost(batch(512, 512))


def test_ranks_with_fewer_batches_get_zero_loss_batches() -> None:
    shares = assign_micro_batches([batch(30), batch(20), batch(5)], 2)
    assert [[b.num_tokens for b in s] for s in shares] == [[30, 2], [20, 5]]
    filler = shares[0][1]
    assert filler.num_loss_tokens == 0 and filler.sample_lengths.tolist() == [2]


def test_more_ranks_than_batches_still_gives_every_rank_a_pass() -> None:
    shares = assign_micro_batches([batch(8)], 3)
    assert [len(s) for s in shares] == [1, 1, 1]
    assert sum(b.num_loss_tokens for s in shares for b in s) == 8
