"""Off-policy measures and masks of the RL loss, with staleness kept apart from mismatch.

A loss token's behaviour weight w = π_prox/μ compares the trainer's policy at the step's
weights (π_prox, no gradient) with the policy μ that sampled it. A token sampled by the
version the trainer holds (staleness 0) differs only by numerics: that is the mismatch;
older tokens add staleness. Per-step metrics are sums of token-mean parts, one fixed key
set on every rank (they are summed over ranks in one collective); `finish_metrics` turns
them into means over each staleness bucket once summed (a sum of shares is no mean).
"""

from __future__ import annotations

import torch

from tidal.trainer.config import TrustRegionConfig
from tidal.trainer.loss_normalization import segment_sum

STALENESS_BUCKETS = ("0", "1", "2", "3", "4+")
"""Staleness (trainer version - sampling version) buckets of the per-step metrics."""


def _kl_name(bucket: str) -> str:
    return "mismatch_kl" if bucket == "0" else f"stale_kl/{bucket}"


def token_staleness(versions: torch.Tensor | None, trainer_version: int, n: int) -> torch.Tensor:
    """(N,) int64 staleness of each token from its (N,) sampling version; -1 = unknown."""
    if versions is None:
        return torch.full((n,), -1, dtype=torch.int64)
    staleness = trainer_version - versions  # (N,)
    return torch.where((versions >= 0) & (staleness >= 0), staleness, -1)


def measure(
    log_w: torch.Tensor,  # (N,) log π_prox/μ, 0 off the mask
    staleness: torch.Tensor | None,  # (N,) int64, -1 = unknown; None: all unknown
    metric_weights: torch.Tensor,  # (N,) loss_mask / step loss tokens
) -> dict[str, torch.Tensor]:
    """Token-mean parts: the behaviour KL overall and per staleness bucket, and the shares."""
    k3 = log_w.exp() - 1.0 - log_w  # (N,) k3 estimate of KL(μ ‖ π_prox)
    if staleness is None:
        staleness = torch.full_like(log_w, -1, dtype=torch.int64)
    staleness = staleness.to(log_w.device)
    parts = {"behaviour_kl": (k3 * metric_weights).sum()}
    last = len(STALENESS_BUCKETS) - 1
    bucket = torch.where(staleness >= 0, staleness.clamp(max=last), -1)  # (N,)
    for i, name in enumerate((*STALENESS_BUCKETS, "unknown")):
        in_bucket = metric_weights * (bucket == (i if i <= last else -1))  # (N,)
        parts[f"staleness_share/{name}"] = in_bucket.sum()
        if name != "unknown":
            parts[_kl_name(name)] = (k3 * in_bucket).sum()
    return parts


def finish_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Step metrics with each bucket's KL turned from its share of the step's token mean
    into the mean over the bucket's tokens: `mismatch_kl` (staleness 0, numerics only) and
    `stale_kl/<s>`; a bucket without tokens has none."""
    out = dict(metrics)
    for name in STALENESS_BUCKETS:
        share = metrics.get(f"staleness_share/{name}", 0.0)
        total = out.pop(_kl_name(name), None)
        if total is not None and share > 0:
            out[_kl_name(name)] = total / share
    return out


def mis_keep(
    log_w: torch.Tensor,  # (N,) token log π_prox/μ, 0 off the mask
    logprobs: torch.Tensor,  # (N,) trainer logprobs
    behaviour_logprobs: torch.Tensor,  # (N,)
    loss_mask: torch.Tensor,  # (N,)
    segments: torch.Tensor,  # (N,) int64 sample of each token
    num_segments: int,
    region: TrustRegionConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(N,) 1.0 where no mask of `region` drops the token, and each mask's (N,) drops."""
    with torch.no_grad():
        on = loss_mask > 0  # (N,) bool
        bounds: dict[str, tuple[torch.Tensor, float | None, float | None]] = {
            "mis_token": (log_w, region.ratio_low, region.ratio_high)
        }
        if region.per_sequence:
            per_sample = segment_sum(log_w, segments, num_segments)  # (S,) Σ log w
            tokens = segment_sum(loss_mask, segments, num_segments).clamp(min=1.0)  # (S,)
            product = per_sample[segments]  # (N,) log Π w of the token's sample
            geo = (per_sample / tokens)[segments]  # (N,) its mean log w
            bounds["mis_sequence"] = (
                product,
                region.sequence_ratio_low,
                region.sequence_ratio_high,
            )
            bounds["geo"] = (geo, region.geo_ratio_low, region.geo_ratio_high)
        drops = {
            name: _outside(value, low, high)
            for name, (value, low, high) in bounds.items()
            if low is not None or high is not None
        }
        if region.max_prob_diff is not None:
            diff = (logprobs.exp() - behaviour_logprobs.exp()).abs()  # (N,)
            drops["prob_diff"] = diff > region.max_prob_diff
        drops = {k: v & on for k, v in drops.items()}
        keep = on.clone()
        for dropped in drops.values():
            keep &= ~dropped
    return keep.float(), drops


def _outside(log_value: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    """(N,) bool where exp(log_value) leaves [low, high]."""
    value = log_value.exp()
    out = torch.zeros_like(log_value, dtype=torch.bool)
    if low is not None:
        out |= value < low
    if high is not None:
        out |= value > high
    return out
