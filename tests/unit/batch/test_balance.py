"""Packing for data-parallel ranks: equal counts, balanced cost, budgets."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tidal.batch.balance import pack_for_ranks, sample_cost, split_by_cost
from tidal.batch.packing import TrainSample


def _samples(count: int, seed: int = 0, max_completion: int = 60) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = tuple(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        completion = tuple(rng.randrange(256) for _ in range(rng.randint(1, max_completion)))
        out.append(TrainSample(prompt, completion, advantage=float(i)))
    return out


def _sample_tokens(batches) -> list[tuple[int, tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    seen = []
    for b in batches:
        starts = np.concatenate([[0], np.cumsum(b.sample_lengths)[:-1]])
        for start, length in zip(starts, b.sample_lengths, strict=True):
            seen.append((int(b.advantages[start]), tuple(b.input_ids[start : start + length])))
    return seen


@pytest.mark.parametrize(("count", "ranks", "budget"), [(64, 2, 128), (37, 4, 100), (9, 3, 80)])
def test_ranks_get_equal_counts_within_budget_and_every_token_once(
    count: int, ranks: int, budget: int
) -> None:
    samples = _samples(count, seed=count)
    per_rank = pack_for_ranks(samples, budget, ranks)
    assert len(per_rank) == ranks
    assert len({len(batches) for batches in per_rank}) == 1
    flat = [b for batches in per_rank for b in batches]
    assert all(b.num_tokens <= budget for b in flat)
    expected = [(i, s.prompt_ids + s.completion_ids) for i, s in enumerate(samples)]
    assert sorted(_sample_tokens(flat)) == sorted(expected)


@pytest.mark.parametrize("seed", range(5))
def test_rank_costs_differ_by_at_most_one_sample(seed: int) -> None:
    samples = _samples(50, seed=seed)
    per_rank = pack_for_ranks(samples, 256, 4)
    costs = [
        sum(sample_cost(int(n)) for b in batches for n in b.sample_lengths) for batches in per_rank
    ]
    largest = max(sample_cost(s.num_tokens) for s in samples)
    assert max(costs) - min(costs) <= largest


@pytest.mark.parametrize("ranks", [1, 3])
def test_every_micro_batch_is_labelled_with_the_rank_it_was_packed_for(ranks: int) -> None:
    per_rank = pack_for_ranks(_samples(30), 256, ranks)
    assert [{b.rank for b in batches} for batches in per_rank] == [{r} for r in range(ranks)]


def test_split_by_cost_puts_longest_first_on_the_cheapest_rank() -> None:
    assert split_by_cost([10, 1, 9, 2], 2) == [[0, 1], [2, 3]]


def test_one_rank_gets_all_samples() -> None:
    samples = _samples(20)
    (only,) = pack_for_ranks(samples, 512, 1)
    assert sum(b.num_tokens for b in only) == sum(s.num_tokens for s in samples)


def test_fewer_samples_than_ranks_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 samples cannot feed 4"):
        pack_for_ranks(_samples(3), 512, 4)


def _groups(prompts: int, per_group: int, seed: int = 0) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = tuple(rng.randrange(256) for _ in range(rng.randint(8, 20)))
        for i in range(per_group):
            completion = tuple(rng.randrange(256) for _ in range(rng.randint(1, 10)))
            out.append(TrainSample(prompt, completion, advantage=float(p * per_group + i)))
    return out


@pytest.mark.parametrize(("prompts", "ranks", "budget"), [(4, 1, 128), (4, 2, 64), (1, 2, 200)])
def test_shared_prompts_train_every_completion_once_within_budget(
    prompts: int, ranks: int, budget: int
) -> None:
    samples = _groups(prompts, 8)
    per_rank = pack_for_ranks(samples, budget, ranks, share_prompts=True)
    assert len({len(batches) for batches in per_rank}) == 1
    completions = []
    for rank, batches in enumerate(per_rank):
        for b in batches:
            assert b.rank == rank and b.num_tokens <= budget
            for start, length in zip(
                np.cumsum(b.sample_lengths) - b.sample_lengths, b.sample_lengths, strict=True
            ):
                trained = b.loss_mask[start : start + length] == 1
                if trained.any():
                    completions.append(tuple(b.input_ids[start : start + length][trained]))
    assert any(b.sample_parents is not None for r in per_rank for b in r)
    assert sorted(completions) == sorted(s.completion_ids for s in samples)
    unshared = sum(b.num_tokens for r in pack_for_ranks(samples, budget, ranks) for b in r)
    assert sum(b.num_tokens for r in per_rank for b in r) < unshared


def test_shared_prompts_fall_back_to_smaller_groups_to_equalise_ranks() -> None:
    samples = _groups(3, 8, seed=1)
    per_rank = pack_for_ranks(samples, 100, 2, share_prompts=True)
    assert len(per_rank[0]) == len(per_rank[1])
    assert sum(int(b.loss_mask.sum()) for r in per_rank for b in r) == sum(
        len(s.completion_ids) for s in samples
    )


def test_a_sample_without_completion_tokens_keeps_its_prompt_and_the_budget_holds() -> None:
    """The group's other completions still share the prompt; the empty one is laid out
    with its own copy, and the packer counts it so, so no micro-batch passes the budget."""
    prompt = tuple(range(1, 31))  # 30 tokens
    samples = [
        TrainSample(prompt, (), advantage=0.0),
        *(TrainSample(prompt, (40 + i, 41 + i), advantage=float(i)) for i in range(4)),
    ]
    budget = len(prompt) + 4 * 2  # the shared group fits exactly; the empty one does not
    (batches,) = pack_for_ranks(samples, budget, 1, share_prompts=True)
    assert all(b.num_tokens <= budget for b in batches)
    shared = [b for b in batches if b.sample_parents is not None]
    assert len(shared) == 1 and list(shared[0].sample_parents) == [-1, 0, 0, 0, 0]
    assert sum(b.num_tokens for b in batches) == budget + len(prompt)
