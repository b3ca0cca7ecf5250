"""The step losses equal an obviously-correct per-sequence, per-token loop: values and gradients.

The reference walks sequences and tokens one at a time with Python scalars, following the
textbook formulas; the implementation under test is vectorised over packed tokens. Each
token's term reads its own advantage, whether a sample's value or one varying along it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tidal.batch.tensors import segment_ids
from tidal.trainer.config import LossConfig
from tidal.trainer.loss import TokenInputs, kl_estimate, rl_loss, sft_loss, token_entropy
from tidal.trainer.loss_normalization import StepCounts, token_weights


def reference_rl_loss(
    lp: torch.Tensor,
    blp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    seg: torch.Tensor,
    cfg: LossConfig,
    *,
    ref: torch.Tensor | None = None,
    ent: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss, one sequence and one token at a time; also clip/mask counts per loss token."""
    sequences: dict[int, list[int]] = {}
    for t in range(len(lp)):
        if mask[t] == 1:
            sequences.setdefault(int(seg[t]), []).append(t)
    n_tokens = sum(len(ts) for ts in sequences.values())
    loss = torch.zeros(())
    clipped = masked = 0
    for tokens in sequences.values():
        seq_ratio = torch.exp(sum(lp[t] - blp[t] for t in tokens) / len(tokens))
        for t in tokens:
            if cfg.norm == "token":
                weight = 1.0 / n_tokens
            elif cfg.norm == "sequence":
                weight = 1.0 / (len(tokens) * len(sequences))
            else:
                weight = 1.0 / cfg.norm_constant  # type: ignore[operator]
            token_ratio = torch.exp(lp[t] - blp[t])
            ratio = seq_ratio if cfg.ratio_level == "sequence" else token_ratio
            r, r_lp = float(token_ratio.detach()), float(lp[t].detach())
            region = cfg.trust_region
            inside = (
                (region.ratio_low is None or r >= region.ratio_low)
                and (region.ratio_high is None or r <= region.ratio_high)
                and (
                    region.max_prob_diff is None
                    or abs(math.exp(r_lp) - math.exp(float(blp[t]))) <= region.max_prob_diff
                )
            )
            if inside:
                bounded = min(max(float(ratio.detach()), 1 - cfg.clip_low), 1 + cfg.clip_high)
                if ratio * adv[t] <= bounded * adv[t]:
                    loss = loss - weight * ratio * adv[t]  # unclipped: gradient flows
                else:
                    loss = loss - weight * bounded * adv[t]  # clipped: a constant
                    clipped += 1
            else:
                masked += 1
            if cfg.kl.coef > 0:
                assert ref is not None
                d = lp[t] - ref[t]
                kl = {"k1": d, "k2": 0.5 * d * d, "k3": torch.exp(-d) + d - 1}[cfg.kl.estimator]
                loss = loss + cfg.kl.coef * weight * kl
            if cfg.entropy_coef > 0:
                assert ent is not None
                loss = loss - cfg.entropy_coef * weight * ent[t]
    return loss, {"clip_frac": clipped / n_tokens, "mask_frac": masked / n_tokens}


def make_tokens(n: int, seed: int, spread: float = 1.2) -> dict[str, torch.Tensor]:
    """Random packed tokens of six samples; trainer logprobs drift ±spread/2 nats per token
    plus a per-sample shift, so sequence-level ratios leave the clip range too."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([n // 8, n // 8 + 3, n // 4 - 3, n // 8, n // 8, n // 4])
    seg = segment_ids(lengths)
    behaviour = -torch.rand(n, generator=g) * 3
    mask = (torch.rand(n, generator=g) > 0.3).float()
    shift = (torch.randn(len(lengths), generator=g) * 0.15)[seg]
    return {
        "lp": behaviour + shift + (torch.rand(n, generator=g) - 0.5) * spread,
        "blp": behaviour * mask,
        "adv": torch.randn(len(lengths), generator=g)[seg],  # the sample's advantage
        "mask": mask,
        "seg": seg,
        "ref": behaviour + (torch.rand(n, generator=g) - 0.5),
        "ent": torch.rand(n, generator=g) * 4,
        "token_adv": torch.randn(n, generator=g) * 0.5,  # each token's own term
    }


def run_loss(
    d: dict[str, torch.Tensor], cfg: LossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    lp = d["lp"].clone().requires_grad_()
    ent = d["ent"].clone().requires_grad_()
    num_segments = int(d["seg"].max()) + 1
    per_sample = torch.zeros(num_segments).index_add_(0, d["seg"], d["mask"])
    counts = StepCounts(int(d["mask"].sum()), int((per_sample > 0).sum()))
    weights = token_weights(
        d["mask"], d["seg"], num_segments, norm=cfg.norm, counts=counts, constant=cfg.norm_constant
    )
    inputs = TokenInputs(
        logprobs=lp,
        behaviour_logprobs=d["blp"],
        advantages=d["adv"],
        loss_mask=d["mask"],
        segments=d["seg"],
        num_segments=num_segments,
        entropy=ent,
        ref_logprobs=d["ref"],
        staleness=d.get("staleness", torch.zeros_like(d["seg"])),  # sampled by this version
    )
    loss, metrics = rl_loss(
        inputs, config=cfg, weights=weights, metric_weights=d["mask"] / counts.loss_tokens
    )
    grad_lp, grad_ent = torch.autograd.grad(loss, [lp, ent], allow_unused=True)
    return loss, metrics, grad_lp, grad_ent if grad_ent is not None else torch.zeros_like(ent)


def check_against_reference(
    cfg: LossConfig, seed: int = 0, spread: float = 1.2, *, per_token: bool = False
) -> dict[str, Any]:
    """`per_token`: advantages varying along each sample (the sample's plus a token term)."""
    d = make_tokens(64, seed, spread)
    if per_token:
        d["adv"] = d["adv"] + d["token_adv"]
    loss, metrics, grad_lp, grad_ent = run_loss(d, cfg)
    lp = d["lp"].clone().requires_grad_()
    ent = d["ent"].clone().requires_grad_()
    ref_loss, ref_metrics = reference_rl_loss(
        lp, d["blp"], d["adv"], d["mask"], d["seg"], cfg, ref=d["ref"], ent=ent
    )
    ref_grad_lp, ref_grad_ent = torch.autograd.grad(ref_loss, [lp, ent], allow_unused=True)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad_lp, ref_grad_lp)
    if ref_grad_ent is not None:
        torch.testing.assert_close(grad_ent, ref_grad_ent)
    assert float(metrics["clip_frac"]) == pytest.approx(ref_metrics["clip_frac"])
    assert float(metrics["mask_frac"]) == pytest.approx(ref_metrics["mask_frac"])
    return ref_metrics


ADVANTAGES = pytest.mark.parametrize(
    "per_token", [False, True], ids=["sample-advantage", "per-token-advantage"]
)


@ADVANTAGES
@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_clipped_surrogate_matches_reference_for_each_ratio_level_and_normalization(
    level: str, norm: str, per_token: bool
) -> None:
    cfg = LossConfig(ratio_level=level, norm=norm, norm_constant=100.0)  # type: ignore[arg-type]
    if level == "sequence":  # GSPO-sized epsilons, so sequence ratios are clipped too
        cfg = cfg.model_copy(update={"clip_low": 0.02, "clip_high": 0.03})
    seen = check_against_reference(
        cfg, spread=1.2 if level == "token" else 0.4, per_token=per_token
    )
    assert seen["clip_frac"] > 0.05  # the clipped path is exercised


def test_clip_higher_uses_separate_low_and_high_bounds() -> None:
    d = {
        "lp": torch.tensor([0.0, 0.0, 0.0, 0.0]),
        "blp": torch.log(torch.tensor([1 / 1.25, 1 / 1.25, 1 / 0.85, 1 / 0.75])),
        "adv": torch.tensor([1.0, 1.0, -1.0, -1.0]),  # ratios 1.25, 1.25, 0.85, 0.75
        "mask": torch.ones(4),
        "seg": torch.tensor([0, 0, 1, 1]),
        "ref": torch.zeros(4),
        "ent": torch.zeros(4),
    }
    _, metrics, grad, _ = run_loss(d, LossConfig(clip_low=0.2, clip_high=0.28))
    # 1.25 < 1.28: not clipped (gradient -ratio·A/4); 0.85 > 0.8: not clipped; 0.75 < 0.8: clipped
    torch.testing.assert_close(grad, torch.tensor([-1.25, -1.25, 0.85, 0.0]) / 4)
    assert float(metrics["clip_low_frac"]) == pytest.approx(0.25)
    assert float(metrics["clip_high_frac"]) == 0.0
    _, metrics, grad, _ = run_loss(d, LossConfig(clip_low=0.2, clip_high=0.2))
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, 0.85, 0.0]) / 4)
    assert float(metrics["clip_high_frac"]) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "region",
    [
        {"ratio_low": 0.8, "ratio_high": 1.25},
        {"max_prob_diff": 0.1},
        {"ratio_high": 1.1, "max_prob_diff": 0.2},
    ],
)
@ADVANTAGES
def test_trust_region_masking_matches_reference(region: dict[str, float], per_token: bool) -> None:
    cfg = LossConfig.model_validate({"trust_region": region, "clip_high": 10.0, "clip_low": 0.9})
    seen = check_against_reference(cfg, per_token=per_token)
    assert 0.05 < seen["mask_frac"] < 0.95  # some tokens masked, some kept


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_and_entropy_bonus_match_reference(estimator: str) -> None:
    cfg = LossConfig.model_validate(
        {"kl": {"coef": 0.3, "estimator": estimator}, "entropy_coef": 0.05, "norm": "sequence"}
    )
    check_against_reference(cfg, seed=3)


def test_kl_estimators_agree_with_closed_forms() -> None:
    lp, ref = torch.tensor([-1.0, -0.5]), torch.tensor([-1.5, -0.5])
    torch.testing.assert_close(kl_estimate(lp, ref, "k1"), torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(kl_estimate(lp, ref, "k2"), torch.tensor([0.125, 0.0]))
    torch.testing.assert_close(
        kl_estimate(lp, ref, "k3"), torch.tensor([math.exp(-0.5) + 0.5 - 1, 0.0])
    )


@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
def test_micro_batch_parts_add_up_to_the_whole_step(norm: str) -> None:
    """Splitting the packed tokens at a sample boundary leaves the step loss unchanged."""
    d = make_tokens(64, seed=5)
    cfg = LossConfig(norm=norm, norm_constant=50.0, ratio_level="sequence", kl={"coef": 0.1})  # type: ignore[arg-type]
    whole, _, _, _ = run_loss(d, cfg)
    cut = int((d["seg"] == 0).sum())  # first sample alone | the rest
    num_segments = int(d["seg"].max()) + 1
    per_sample = torch.zeros(num_segments).index_add_(0, d["seg"], d["mask"])
    counts = StepCounts(int(d["mask"].sum()), int((per_sample > 0).sum()))  # global counts
    parts = []
    for piece in (slice(0, cut), slice(cut, None)):
        sub = {k: v[piece] for k, v in d.items()}
        seg = sub["seg"] - sub["seg"].min()
        n = int(seg.max()) + 1
        weights = token_weights(
            sub["mask"], seg, n, norm=cfg.norm, counts=counts, constant=cfg.norm_constant
        )
        inputs = TokenInputs(
            sub["lp"], sub["blp"], sub["adv"], sub["mask"], seg, n, ref_logprobs=sub["ref"]
        )
        loss, _ = rl_loss(inputs, config=cfg, weights=weights, metric_weights=sub["mask"] / 1)
        parts.append(loss)
    torch.testing.assert_close(parts[0] + parts[1], whole)


def test_mismatch_kl_is_zero_on_policy_and_positive_off_policy() -> None:
    d = make_tokens(40, seed=6)
    on = {**d, "lp": d["blp"].clone()}
    _, metrics, _, _ = run_loss(on, LossConfig())
    assert float(metrics["mismatch_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(metrics["clip_frac"]) == 0.0
    _, metrics, _, _ = run_loss(d, LossConfig())
    assert float(metrics["mismatch_kl"]) > 0.01


def test_sft_loss_is_masked_negative_log_likelihood() -> None:
    logprobs = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    mask = torch.tensor([0.0, 1.0, 1.0, 0.0])
    loss, metrics = sft_loss(logprobs, mask / 4)
    assert loss.item() == pytest.approx((2.0 + 3.0) / 4)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, -0.25, -0.25, 0.0]))
    assert float(metrics["nll"]) == pytest.approx(1.25)


def test_token_entropy_of_uniform_is_log_vocab() -> None:
    logprobs_all = torch.log_softmax(torch.zeros(3, 8), dim=-1)
    torch.testing.assert_close(token_entropy(logprobs_all), torch.full((3,), math.log(8)))


def test_constant_normalization_needs_a_constant() -> None:
    with pytest.raises(ValueError, match="norm_constant"):
        LossConfig(norm="constant")
