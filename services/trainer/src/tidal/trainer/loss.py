"""Losses of one training step: the RL objective (clipped policy gradient, KL, entropy) and SFT.

Pure functions over flat, already aligned per-token tensors `(N,)`; aligning targets is
the caller's (`train_step`). Every term is a weighted sum Σ w_t ℓ_t with the step-level
weights of `loss_normalization.py`, so micro-batch losses add up to the step loss
whatever the split; metrics are token means over the step and add up the same way. The
ratio is per token or GSPO's per sequence, through PPO's surrogate with separate low and
high clips; the off-policy corrections (off_policy.py) weight or remove terms, never
change the normalizer. Advantages are per token: each term takes its own token's, under a
sequence-level ratio too (GSPO: the sample's ratio, each token's advantage), sequence-level
masks drop a sample's tokens whatever their advantages, and normalizers never read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from tidal.trainer.config import LossConfig
from tidal.trainer.loss_normalization import segment_sum
from tidal.trainer.off_policy import measure, mis_keep

KLEstimator = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class TokenInputs:
    """Aligned per-token inputs of one micro-batch's RL loss."""

    logprobs: torch.Tensor  # (N,) trainer logprob of each target token, with grad
    behaviour_logprobs: torch.Tensor  # (N,) logprob under the policy that sampled it
    advantages: torch.Tensor  # (N,) per token; a sample-level estimator repeats its value
    loss_mask: torch.Tensor  # (N,) 1.0 for trained tokens, else 0.0
    segments: torch.Tensor  # (N,) int64 index of each token's sample
    num_segments: int
    entropy: torch.Tensor | None = None  # (N,) next-token entropy, with grad
    ref_logprobs: torch.Tensor | None = None  # (N,) frozen reference model's logprobs
    staleness: torch.Tensor | None = None  # (N,) int64 versions behind the trainer, -1 unknown


def weighted_sum(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_t w_t · v_t; weights are zero off the mask."""
    return (values * weights).sum()


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator
) -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π: (N,), (N,) → (N,)."""
    log_ratio = logprobs - ref_logprobs  # (N,) log π/π_ref
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; supported: k1, k2, k3")


def token_log_ratio(inputs: TokenInputs) -> torch.Tensor:
    """(N,) log π/μ of each loss token, 0 elsewhere: masked positions carry behaviour
    logprob 0 by contract, and a very negative trainer logprob there must not overflow
    exp() into inf * 0 = nan."""
    return torch.where(inputs.loss_mask > 0, inputs.logprobs - inputs.behaviour_logprobs, 0.0)


def at_level(
    token: torch.Tensor, inputs: TokenInputs, level: Literal["token", "sequence"]
) -> torch.Tensor:
    """(N,) a per-token log-ratio (0 off the mask) as is, or its sample's mean (GSPO)."""
    if level == "token":
        return token
    mask = inputs.loss_mask
    per_sample = segment_sum(token, inputs.segments, inputs.num_segments)  # (S,)
    tokens = segment_sum(mask, inputs.segments, inputs.num_segments).clamp(min=1.0)  # (S,)
    return (per_sample / tokens)[inputs.segments] * mask  # (N,) the sample's mean log-ratio


def rl_loss(
    inputs: TokenInputs,
    *,
    config: LossConfig,
    weights: torch.Tensor,  # (N,) normalization weights (loss_normalization.token_weights)
    metric_weights: torch.Tensor,  # (N,) loss_mask / step loss tokens
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the step's RL loss (to minimise) and its metric parts.

    π_θ/μ = (π_θ/π_prox)·w with π_prox the trainer's policy at the step's weights (the
    detached logprobs: one update per step) and w the behaviour weight π_prox/μ. Coupled:
    the clipped ratio is (π_θ/π_prox)·min(w, C); decoupled: it is π_θ/π_prox and the term
    is weighted by min(w, C). C is `tis_cap` (unset: ∞)."""
    log_w_token = token_log_ratio(inputs).detach()  # (N,) log π_prox/μ
    on = inputs.loss_mask > 0
    log_rho = at_level(  # (N,) log π_θ/π_prox: 0 in value, ∇ log π_θ in gradient
        torch.where(on, inputs.logprobs - inputs.logprobs.detach(), 0.0),
        inputs,
        config.ratio_level,
    )
    log_w = at_level(log_w_token, inputs, config.ratio_level)  # (N,)
    capped = log_w if config.tis_cap is None else log_w.clamp(max=math.log(config.tis_cap))
    if config.objective == "coupled":
        ratio, coef = torch.exp(log_rho + capped), torch.ones_like(log_w)  # (N,), (N,)
    else:
        ratio, coef = torch.exp(log_rho), torch.exp(capped)
    adv = inputs.advantages
    unclipped = ratio * adv  # (N,)
    clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high) * adv  # (N,)
    surrogate = torch.minimum(unclipped, clipped)  # (N,) pessimistic bound
    keep, drops = mis_keep(
        log_w_token,
        inputs.logprobs,
        inputs.behaviour_logprobs,
        inputs.loss_mask,
        inputs.segments,
        inputs.num_segments,
        config.trust_region,
    )  # (N,)
    loss = -weighted_sum(surrogate * coef * keep, weights)
    if config.kl.coef > 0:
        if inputs.ref_logprobs is None:
            raise ValueError("loss.kl.coef > 0 needs reference logprobs")
        kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, config.kl.estimator)  # (N,)
        loss = loss + config.kl.coef * weighted_sum(kl, weights)
    if config.entropy_coef > 0:
        if inputs.entropy is None:
            raise ValueError("loss.entropy_coef > 0 needs the per-token entropy")
        loss = loss - config.entropy_coef * weighted_sum(inputs.entropy, weights)
    with torch.no_grad():
        # The clipped branch is active (and passes no gradient) where it is strictly lower.
        active = (clipped < unclipped) & (keep > 0)  # (N,)
        metrics = {
            "clip_frac": weighted_sum(active.float(), metric_weights),
            "clip_low_frac": weighted_sum((active & (ratio < 1.0)).float(), metric_weights),
            "clip_high_frac": weighted_sum((active & (ratio > 1.0)).float(), metric_weights),
            "mask_frac": weighted_sum(1.0 - keep, metric_weights),
            "ratio": weighted_sum(ratio * coef, metric_weights),
            **measure(log_w_token, inputs.staleness, metric_weights),
        }
        if config.tis_cap is not None:
            capped_tokens = (log_w > math.log(config.tis_cap)) & on
            metrics["correction/tis"] = weighted_sum(capped_tokens.float(), metric_weights)
        for name, dropped in drops.items():
            metrics[f"correction/{name}"] = weighted_sum(dropped.float(), metric_weights)
        if inputs.ref_logprobs is not None:
            ref_kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, "k3")
            metrics["ref_kl"] = weighted_sum(ref_kl, metric_weights)
    return loss, metrics


def sft_loss(
    logprobs: torch.Tensor,  # (N,) trainer logprob of each target token, with grad
    weights: torch.Tensor,  # (N,) normalization weights, zero off the mask
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy (negative log-likelihood) of the loss tokens, normalized by `weights`."""
    loss = -weighted_sum(logprobs, weights)
    return loss, {"nll": loss.detach()}


def token_entropy(logprobs_all: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's next-token distribution: (N, V) log-softmax → (N,)."""
    return -(logprobs_all.exp() * logprobs_all).sum(dim=-1)
