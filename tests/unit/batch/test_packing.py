"""Padding-free packing: budgets, token conservation, the MicroBatch alignment contract and
truncation to the budget."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import (
    PackedMicroBatch,
    TrainSample,
    assign_bins,
    build_micro_batch,
    fit_to_budget,
)


def _samples(count: int, seed: int = 0) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = tuple(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        completion = tuple(rng.randrange(256) for _ in range(rng.randint(1, 20)))
        logprobs = tuple(-rng.random() for _ in completion)
        out.append(
            TrainSample(prompt, completion, advantage=float(i), completion_logprobs=logprobs)
        )
    return out


def pack_micro_batches(samples: list[TrainSample], budget: int) -> list[PackedMicroBatch]:
    """Plain packing: the one-rank case of the rank split."""
    (batches,) = pack_for_ranks(samples, budget, 1)
    return batches


@pytest.mark.parametrize("budget", [32, 57, 200])
def test_no_micro_batch_exceeds_the_budget(budget: int) -> None:
    batches = pack_micro_batches(_samples(100), budget)
    assert all(b.num_tokens <= budget for b in batches)


def test_every_sample_is_packed_exactly_once() -> None:
    samples = _samples(100)
    batches = pack_micro_batches(samples, 64)
    # each sample's advantage is its index, so the (advantage, tokens) pairs identify it
    seen = []
    for b in batches:
        starts = np.concatenate([[0], np.cumsum(b.sample_lengths)[:-1]])
        for start, length in zip(starts, b.sample_lengths, strict=True):
            seen.append((int(b.advantages[start]), tuple(b.input_ids[start : start + length])))
    expected = [(i, s.prompt_ids + s.completion_ids) for i, s in enumerate(samples)]
    assert sorted(seen) == sorted(expected)
    assert sum(b.num_tokens for b in batches) == sum(s.num_tokens for s in samples)


def test_best_fit_decreasing_fills_bins() -> None:
    assert assign_bins([6, 5, 4, 3, 2], budget=10) == [[0, 2], [1, 3, 4]]


def test_sample_longer_than_the_budget_is_an_error() -> None:
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        pack_micro_batches(_samples(3), 2)


def test_arrays_follow_the_micro_batch_contract() -> None:
    a = TrainSample((256, 97, 62), (98, 257), advantage=0.5, completion_logprobs=(-0.1, -0.2))
    b = TrainSample((256, 99), (100,), advantage=-1.0, completion_logprobs=(-0.3,))
    mb = build_micro_batch([a, b])
    assert mb.input_ids.dtype == np.int32 and mb.position_ids.dtype == np.int32
    assert mb.sample_lengths.dtype == np.int32
    assert {mb.loss_mask.dtype, mb.advantages.dtype, mb.behaviour_logprobs.dtype} == {
        np.dtype(np.float32)
    }
    assert mb.input_ids.tolist() == [256, 97, 62, 98, 257, 256, 99, 100]
    assert mb.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]  # restart per sample
    assert mb.sample_lengths.tolist() == [5, 3]
    # entry t is about predicting input_ids[t]: prompt tokens 0, completion tokens 1
    assert mb.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    np.testing.assert_allclose(mb.behaviour_logprobs, [0, 0, 0, -0.1, -0.2, 0, 0, -0.3])
    np.testing.assert_allclose(mb.advantages, [0.5] * 5 + [-1.0] * 3)


def test_sft_samples_without_logprobs_get_zero_logprobs() -> None:
    mb = build_micro_batch([TrainSample((256, 97), (97, 257), advantage=1.0)])
    assert mb.behaviour_logprobs.tolist() == [0, 0, 0, 0]
    assert mb.loss_mask.tolist() == [0, 0, 1, 1]


def test_logprob_count_must_match_completion() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        TrainSample((256,), (1, 2), advantage=0.0, completion_logprobs=(-1.0,))


def test_truncation_keeps_the_prompt_and_the_first_completion_tokens() -> None:
    sample = TrainSample(
        (1, 2, 3), (4, 5, 6, 7), advantage=0.5, completion_logprobs=(-1, -2, -3, -4)
    )
    cut = fit_to_budget(sample, 5)
    assert cut is not None
    assert (cut.prompt_ids, cut.completion_ids, cut.completion_logprobs) == (
        (1, 2, 3),
        (4, 5),
        (-1, -2),
    )
    assert cut.advantage == 0.5
    assert fit_to_budget(sample, 7) is sample


def test_sample_whose_prompt_fills_the_budget_cannot_be_truncated() -> None:
    assert fit_to_budget(TrainSample((1, 2, 3), (4,), advantage=0.0), 3) is None


def test_truncating_a_sample_keeps_the_versions_of_the_kept_tokens() -> None:
    sample = TrainSample((256, 1), (3, 4, 5), advantage=1.0, completion_versions=(4, 5, 6))
    assert fit_to_budget(sample, 4).completion_versions == (4, 5)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="2 versions for 3 completion tokens"):
        TrainSample((256,), (3, 4, 5), advantage=1.0, completion_versions=(1, 2))


def test_shared_prompts_hold_a_group_prompt_once_before_its_completions() -> None:
    a = TrainSample((256, 97, 62), (98, 257), advantage=0.5, completion_logprobs=(-0.1, -0.2))
    b = TrainSample((256, 99), (100,), advantage=-1.0, completion_logprobs=(-0.3,))
    c = TrainSample((256, 97, 62), (5,), advantage=2.0, completion_logprobs=(-0.4,))
    mb = build_micro_batch([a, b, c], share_prompts=True)
    assert mb.input_ids.tolist() == [256, 97, 62, 98, 257, 5, 256, 99, 100]
    assert mb.sample_lengths.tolist() == [3, 2, 1, 3]
    assert mb.sample_parents is not None and mb.sample_parents.tolist() == [-1, 0, 0, -1]
    assert mb.position_ids.tolist() == [0, 1, 2, 3, 4, 3, 0, 1, 2]  # after the prompt
    assert mb.loss_mask.tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 1]
    np.testing.assert_allclose(mb.behaviour_logprobs, [0, 0, 0, -0.1, -0.2, -0.4, 0, 0, -0.3])
    np.testing.assert_allclose(mb.advantages, [0, 0, 0, 0.5, 0.5, 2.0, -1.0, -1.0, -1.0])
    assert mb.policy_versions is not None and mb.policy_versions.tolist() == [-1] * 9


def test_without_a_shared_prompt_the_layout_is_the_unshared_one() -> None:
    a = TrainSample((256, 97), (98,), advantage=0.5)
    b = TrainSample((256, 99), (100,), advantage=-1.0)
    shared, plain = build_micro_batch([a, b], share_prompts=True), build_micro_batch([a, b])
    assert shared.sample_parents is None
    for name in ("input_ids", "position_ids", "sample_lengths", "loss_mask", "advantages"):
        np.testing.assert_array_equal(getattr(shared, name), getattr(plain, name))


@pytest.mark.parametrize("share", [False, True])
def test_a_token_advantage_is_its_samples_plus_its_own_term(share: bool) -> None:
    a = TrainSample((256, 97), (98, 257, 3), advantage=0.5, token_advantages=(0.25, -1.0, 0.0))
    b = TrainSample((256, 97), (4,), advantage=-1.0)
    mb = build_micro_batch([a, b], share_prompts=share)
    trained = mb.advantages[mb.loss_mask > 0]
    np.testing.assert_allclose(trained, [0.75, -0.5, 0.5, -1.0])


def test_truncation_keeps_the_token_advantages_of_the_kept_tokens() -> None:
    sample = TrainSample((256, 1), (3, 4, 5), advantage=1.0, token_advantages=(0.1, 0.2, 0.3))
    assert fit_to_budget(sample, 4).token_advantages == (0.1, 0.2)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="2 token advantages for 3 completion tokens"):
        TrainSample((256,), (3, 4, 5), advantage=1.0, token_advantages=(1.0, 2.0))
