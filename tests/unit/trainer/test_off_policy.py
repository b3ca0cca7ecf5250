"""Each off-policy correction and measure against a case computed by hand.

Behaviour weights w = π_prox/μ are chosen as round numbers (the trainer logprob is log of
a probability, the behaviour one log of another), so every expected loss, gradient and
share below is arithmetic on those numbers.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tidal.trainer.config import LossConfig
from tidal.trainer.loss import TokenInputs, rl_loss
from tidal.trainer.off_policy import finish_metrics, measure, token_staleness

WIDE = {"clip_low": 0.99, "clip_high": 100.0}  # clipping never active: surrogate = ratio·A


def run(
    trainer_p: list[float],
    behaviour_p: list[float],
    lengths: list[int],
    loss: dict[str, Any],
    advantages: list[float] | None = None,
) -> tuple[float, list[float], dict[str, float]]:
    """(loss, d loss / d logprobs, metrics) of one micro-batch, token-mean normalized."""
    n = len(trainer_p)
    lp = torch.tensor([math.log(p) for p in trainer_p], dtype=torch.float64, requires_grad=True)
    blp = torch.tensor([math.log(p) for p in behaviour_p], dtype=torch.float64)
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    mask = torch.ones(n, dtype=torch.float64)
    adv = torch.tensor(advantages or [1.0] * n, dtype=torch.float64)
    inputs = TokenInputs(lp, blp, adv, mask, seg, len(lengths), staleness=torch.zeros(n).long())
    value, metrics = rl_loss(
        inputs, config=LossConfig.model_validate(loss), weights=mask / n, metric_weights=mask / n
    )
    (grad,) = torch.autograd.grad(value, lp)
    return float(value.detach()), grad.tolist(), {k: float(v) for k, v in metrics.items()}


# three tokens of one sample with w = 2, 0.5, 3
P, MU = [0.5, 0.2, 0.9], [0.25, 0.4, 0.3]


def test_token_tis_caps_the_behaviour_weight_at_c() -> None:
    loss, grad, metrics = run(P, MU, [3], {**WIDE, "tis_cap": 2.5})
    assert loss == pytest.approx(-(2 + 0.5 + 2.5) / 3)
    assert grad == pytest.approx([-2 / 3, -0.5 / 3, -2.5 / 3])
    assert metrics["correction/tis"] == pytest.approx(1 / 3)
    loss, _, metrics = run(P, MU, [3], WIDE)  # uncapped
    assert loss == pytest.approx(-(2 + 0.5 + 3) / 3) and "correction/tis" not in metrics


def test_decoupled_objective_clips_against_the_proximal_policy_and_weights_by_w() -> None:
    # Coupled, clip [0.8, 1.28]: w = 2 and 2.5 (capped) are clipped away, 0.5 is not.
    loss, grad, metrics = run(P, MU, [3], {"tis_cap": 2.5})
    assert loss == pytest.approx(-(1.28 + 0.5 + 1.28) / 3)
    assert grad == pytest.approx([0.0, -0.5 / 3, 0.0])
    assert metrics["clip_frac"] == pytest.approx(2 / 3)
    # Decoupled: π_θ/π_prox = 1 stays inside the clip; each term weighted by min(w, C).
    loss, grad, metrics = run(P, MU, [3], {"tis_cap": 2.5, "objective": "decoupled"})
    assert loss == pytest.approx(-(2 + 0.5 + 2.5) / 3)
    assert grad == pytest.approx([-2 / 3, -0.5 / 3, -2.5 / 3])
    assert metrics["clip_frac"] == 0.0


def test_decoupled_clip_still_bounds_the_update_for_negative_advantages() -> None:
    # A = -1: the surrogate min(ρ·A, clip(ρ)·A) at ρ = 1 is -1, unclipped: gradient w/3.
    loss, grad, _ = run(P, MU, [3], {"objective": "decoupled"}, advantages=[-1.0] * 3)
    assert loss == pytest.approx((2 + 0.5 + 3) / 3)
    assert grad == pytest.approx([2 / 3, 0.5 / 3, 3 / 3])


def test_sequence_level_tis_caps_the_samples_geometric_mean_weight() -> None:
    # sample 0: w = 2, 8 → geometric mean 4, capped at 3; sample 1: w = 0.5.
    cfg = {**WIDE, "ratio_level": "sequence", "tis_cap": 3.0}
    loss, grad, metrics = run([0.2, 0.8, 0.1], [0.1, 0.1, 0.2], [2, 1], cfg)
    assert loss == pytest.approx(-(3 + 3 + 0.5) / 3)
    # each token of sample 0 moves its mean log-ratio by 1/2, which both its terms carry:
    # d/d lp_0 of -(r + r)/3 with r = 3·exp(mean) is -(2 · 3 · 1/2)/3 = -1
    assert grad == pytest.approx([-1.0, -1.0, -0.5 / 3])
    assert metrics["correction/tis"] == pytest.approx(2 / 3)


def test_token_mis_drops_tokens_outside_the_band() -> None:
    cfg = {**WIDE, "trust_region": {"ratio_low": 0.6, "ratio_high": 2.5}}
    loss, grad, metrics = run(P, MU, [3], cfg)
    assert loss == pytest.approx(-2 / 3)  # only w = 2 survives
    assert grad == pytest.approx([-2 / 3, 0.0, 0.0])
    assert metrics["correction/mis_token"] == pytest.approx(2 / 3)
    assert metrics["mask_frac"] == pytest.approx(2 / 3)


# sample 0: four tokens of w = 1.5 (product 5.0625, geometric mean 1.5); sample 1: w = 3
SEQ_P, SEQ_MU = [0.6, 0.6, 0.6, 0.6, 0.9], [0.4, 0.4, 0.4, 0.4, 0.3]


def test_sequence_mis_drops_a_whole_sample_by_its_product_weight() -> None:
    cfg = {**WIDE, "trust_region": {"sequence_ratio_high": 4.0}}
    loss, grad, metrics = run(SEQ_P, SEQ_MU, [4, 1], cfg)
    assert loss == pytest.approx(-3 / 5)  # sample 0 (5.06 > 4) is dropped, sample 1 kept
    assert grad == pytest.approx([0.0] * 4 + [-3 / 5])
    assert metrics["correction/mis_sequence"] == pytest.approx(4 / 5)


def test_geometric_mean_masking_is_length_independent() -> None:
    cfg = {**WIDE, "trust_region": {"geo_ratio_high": 2.0}}
    loss, grad, metrics = run(SEQ_P, SEQ_MU, [4, 1], cfg)
    assert loss == pytest.approx(-4 * 1.5 / 5)  # sample 1 (3 > 2) is dropped, sample 0 kept
    assert grad == pytest.approx([-1.5 / 5] * 4 + [0.0])
    assert metrics["correction/geo"] == pytest.approx(1 / 5)
    assert "correction/mis_sequence" not in metrics  # its bounds are unset: not run


def test_staleness_is_the_trainer_version_minus_the_sampling_one() -> None:
    versions = torch.tensor([3, 2, -1, 5, 0])
    assert token_staleness(versions, 3, 5).tolist() == [0, 1, -1, -1, 3]
    assert token_staleness(None, 3, 2).tolist() == [-1, -1]


def test_mismatch_and_stale_kls_are_means_over_their_own_tokens() -> None:
    log_w = torch.tensor([math.log(2), math.log(0.5), 0.0, math.log(3)])
    parts = measure(log_w, torch.tensor([0, 1, 1, -1]), torch.full((4,), 0.25))
    metrics = finish_metrics({k: float(v) for k, v in parts.items()})
    k3 = [2 - 1 - math.log(2), 0.5 - 1 + math.log(2), 0.0, 3 - 1 - math.log(3)]
    assert metrics["mismatch_kl"] == pytest.approx(k3[0])
    assert metrics["stale_kl/1"] == pytest.approx((k3[1] + k3[2]) / 2)
    assert metrics["behaviour_kl"] == pytest.approx(sum(k3) / 4)
    assert metrics["staleness_share/0"] == pytest.approx(0.25)
    assert metrics["staleness_share/1"] == pytest.approx(0.5)
    assert metrics["staleness_share/unknown"] == pytest.approx(0.25)
    assert "stale_kl/2" not in metrics and "stale_kl/4+" not in metrics


@pytest.mark.parametrize("cap", [None, 1.2])
def test_a_sequence_level_ratio_weights_each_token_by_its_own_advantage(
    cap: float | None,
) -> None:
    """GSPO with per-token advantages: every term is the sample's (capped) ratio times the
    token's advantage, so each token's gradient is the ratio's times the sample's mean
    advantage: a varying advantage acts through its sum over the sample."""
    advantages = [1.0, -2.0, 0.5]
    loss = {**WIDE, "ratio_level": "sequence", "tis_cap": cap}
    value, grad, _ = run(P, MU, [3], loss, advantages=advantages)
    w = min(3 ** (1 / 3), cap or math.inf)  # exp(mean log w) of w = 2, 0.5, 3, capped
    assert value == pytest.approx(-w * sum(advantages) / 3)
    assert grad == pytest.approx([-w * sum(advantages) / 9] * 3)
