"""Losses of one training step: clipped importance-weighted policy gradient, and SFT.

Decisions:
- Pure functions over flat per-token tensors `(N,)` that are already aligned: entry i is
  the logprob of one target token, its behaviour logprob, its advantage and its mask.
  Aligning targets (logits at t-1 predict token t) is the caller's job (`train_step`).
- Normalisation is the token mean over the whole step: every micro-batch divides its
  masked sum by `total_tokens`, the number of loss tokens across *all* micro-batches of
  the step. Gradients accumulated over micro-batches then equal the gradient of the mean
  over the step, however the samples were packed (a per-micro-batch mean would weight
  tokens of small micro-batches more). Metrics are normalised the same way, so summing a
  metric over micro-batches gives the step's token mean.
- The importance ratio is token-level, exp(logp - behaviour_logp), with PPO's pessimistic
  clipped surrogate and asymmetric clip bounds (clip-higher). The behaviour policy is
  whatever inference sampled with, so the ratio also corrects trainer/inference mismatch.
- Mismatch KL is the k3 estimator of KL(behaviour ‖ trainer) on the sampled tokens:
  r - 1 - log r with r = π/μ; it is unbiased, non-negative and cheap.
"""

from __future__ import annotations

import torch


def _masked_mean_part(values: torch.Tensor, mask: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """This micro-batch's share of the step's token mean of `values`."""
    return (values * mask).sum() / total_tokens


def policy_gradient_loss(
    logprobs: torch.Tensor,  # (N,) trainer logprob of each target token, with grad
    behaviour_logprobs: torch.Tensor,  # (N,) logprob under the policy that sampled it
    advantages: torch.Tensor,  # (N,)
    loss_mask: torch.Tensor,  # (N,) 1.0 for trained tokens, else 0.0
    *,
    clip_low: float,
    clip_high: float,
    total_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate loss (to minimise) and detached metric parts, both / total_tokens."""
    # Masked positions carry behaviour logprob 0 by contract; zero their log-ratio so a
    # very negative trainer logprob there cannot overflow exp() into inf * 0 = nan.
    log_ratio = torch.where(loss_mask > 0, logprobs - behaviour_logprobs, 0.0)  # (N,)
    ratio = torch.exp(log_ratio)  # (N,)
    unclipped = ratio * advantages  # (N,)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages  # (N,)
    surrogate = torch.minimum(unclipped, clipped)  # (N,) pessimistic bound
    loss = -_masked_mean_part(surrogate, loss_mask, total_tokens)
    with torch.no_grad():
        # The clipped branch is active (and passes no gradient) where it is strictly lower.
        clip_active = (clipped < unclipped).float()  # (N,)
        k3 = ratio - 1.0 - log_ratio  # (N,) >= 0
        metrics = {
            "clip_frac": _masked_mean_part(clip_active, loss_mask, total_tokens),
            "mismatch_kl": _masked_mean_part(k3, loss_mask, total_tokens),
            "ratio": _masked_mean_part(ratio, loss_mask, total_tokens),
        }
    return loss, metrics


def sft_loss(
    logprobs: torch.Tensor,  # (N,) trainer logprob of each target token, with grad
    loss_mask: torch.Tensor,  # (N,)
    *,
    total_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy (negative log-likelihood) on loss tokens, / total_tokens."""
    loss = -_masked_mean_part(logprobs, loss_mask, total_tokens)
    return loss, {"nll": loss.detach()}


def token_entropy(logprobs_all: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's next-token distribution: (N, V) log-softmax → (N,)."""
    return -(logprobs_all.exp() * logprobs_all).sum(dim=-1)
