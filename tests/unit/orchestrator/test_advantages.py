"""Advantage estimators and reward shaping against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from tidal.orchestrator.advantages import (
    compute_advantages,
    group_advantages,
    grpo_advantages,
    has_signal,
    overlong_penalty,
    shape_reward,
)


def test_mean_centred_without_normalisation() -> None:
    # mean of [1, 0, 0.5, 0.5] is 0.5
    np.testing.assert_allclose(
        group_advantages([1.0, 0.0, 0.5, 0.5], normalize=False), [0.5, -0.5, 0.0, 0.0]
    )


def test_std_normalised_by_population_std() -> None:
    # rewards [1, 0, 0.5, 0.5]: centred [0.5, -0.5, 0, 0]; population std sqrt(0.125)
    std = np.sqrt((0.25 + 0.25) / 4)
    expected = np.array([0.5, -0.5, 0.0, 0.0]) / std
    np.testing.assert_allclose(
        group_advantages([1.0, 0.0, 0.5, 0.5], normalize=True), expected, rtol=1e-5
    )


@pytest.mark.parametrize("normalize", [True, False])
def test_zero_variance_group_gives_exact_zeros(normalize: bool) -> None:
    adv = group_advantages([0.7, 0.7, 0.7], normalize=normalize)
    assert adv.dtype == np.float32
    assert np.array_equal(adv, np.zeros(3, dtype=np.float32))


def test_advantages_are_computed_per_group() -> None:
    first, second = grpo_advantages([[1.0, 0.0], [0.2, 0.2]], normalize=False)
    np.testing.assert_allclose(first, [0.5, -0.5])
    np.testing.assert_allclose(second, [0.0, 0.0])


def test_dr_grpo_is_mean_centred_without_std() -> None:
    np.testing.assert_allclose(
        compute_advantages("dr_grpo", [1.0, 0.0, 0.5, 0.5]), [0.5, -0.5, 0.0, 0.0]
    )


def test_grpo_without_normalisation_equals_dr_grpo() -> None:
    rewards = [0.9, 0.1, 0.3]
    np.testing.assert_array_equal(
        compute_advantages("grpo", rewards, normalize=False),
        compute_advantages("dr_grpo", rewards),
    )


def test_rloo_subtracts_the_mean_of_the_other_completions() -> None:
    # r = [1, 0, 0, 1]: others' means are [1/3, 2/3, 2/3, 1/3]
    np.testing.assert_allclose(
        compute_advantages("rloo", [1.0, 0.0, 0.0, 1.0]),
        [2 / 3, -2 / 3, -2 / 3, 2 / 3],
        rtol=1e-6,
    )


def test_rloo_equals_scaled_group_mean_baseline() -> None:
    rewards = [0.2, 0.9, 0.4]
    expected = 3 / 2 * (np.asarray(rewards) - np.mean(rewards))
    np.testing.assert_allclose(compute_advantages("rloo", rewards), expected, rtol=1e-6)


def test_remax_subtracts_the_greedy_reward() -> None:
    np.testing.assert_allclose(
        compute_advantages("remax", [1.0, 0.25, 0.5], greedy_reward=0.5), [0.5, -0.25, 0.0]
    )


def test_remax_without_greedy_reward_is_an_error() -> None:
    with pytest.raises(ValueError, match="greedy"):
        compute_advantages("remax", [1.0, 0.0])


def test_unknown_algorithm_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="grpo, dr_grpo, rloo, remax"):
        compute_advantages("ppo", [1.0, 0.0])


def test_zero_variance_group_has_no_signal() -> None:
    assert not has_signal([0.5, 0.5, 0.5])
    assert has_signal([0.5, 0.5, 0.6])
    np.testing.assert_array_equal(compute_advantages("rloo", [0.3] * 4), np.zeros(4))


def test_overlong_penalty_is_linear_over_the_buffer() -> None:
    # max_tokens 20, buffer 4: no penalty up to 16 tokens, then 0.25 per token up to 1.0
    assert [overlong_penalty(n, 20, buffer=4, penalty=1.0) for n in (10, 16, 17, 18, 20)] == [
        0.0,
        0.0,
        0.25,
        0.5,
        1.0,
    ]
    assert overlong_penalty(20, 20, buffer=0, penalty=1.0) == 0.0  # disabled


def test_shaped_reward_subtracts_overlong_and_length_penalties() -> None:
    # reward 1, 18 of 20 tokens: overlong 0.5 (buffer 4), length 0.1 * 18/20 = 0.09
    shaped = shape_reward(1.0, 18, 20, overlong_buffer=4, length_penalty=0.1)
    assert shaped == pytest.approx(1.0 - 0.5 - 0.09)
