"""GRPO group advantages against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from tidal.orchestrator.advantages import group_advantages, grpo_advantages


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
