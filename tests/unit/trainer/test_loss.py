"""The step losses equal an obviously-correct per-token loop, values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from tidal.trainer.loss import policy_gradient_loss, sft_loss, token_entropy

CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def reference_pg(logprobs, behaviour, advantages, mask, total):  # type: ignore[no-untyped-def]
    """PPO clipped surrogate, one token at a time."""
    loss = torch.zeros(())
    clipped_tokens = 0
    kl = 0.0
    for lp, blp, adv, m in zip(logprobs, behaviour, advantages, mask, strict=True):
        if m == 0:
            continue
        ratio = torch.exp(lp - blp)
        bounded = min(max(float(ratio.detach()), 1 - CLIP_LOW), 1 + CLIP_HIGH)
        if ratio * adv <= bounded * adv:
            loss = loss - ratio * adv  # unclipped branch: gradient flows
        else:
            loss = loss - bounded * adv  # clipped branch: a constant
            clipped_tokens += 1
        r = float(ratio.detach())
        kl += r - 1 - math.log(r)
    return loss / total, clipped_tokens / total, kl / total


def make_tokens(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(n, generator=g) * 3  # (N,)
    # Trainer logprobs drift from the behaviour ones by up to ±0.6 nats: both clip sides hit.
    logprobs = (behaviour + (torch.rand(n, generator=g) - 0.5) * 1.2).requires_grad_()
    advantages = torch.randn(n, generator=g)
    mask = (torch.rand(n, generator=g) > 0.3).float()
    return logprobs, behaviour * mask, advantages, mask


def test_policy_gradient_loss_matches_per_token_loop_including_clipped_tokens() -> None:
    logprobs, behaviour, advantages, mask = make_tokens(200, seed=0)
    total = 300  # the step's loss tokens include other micro-batches
    loss, metrics = policy_gradient_loss(
        logprobs,
        behaviour,
        advantages,
        mask,
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        total_tokens=total,
    )
    (grad,) = torch.autograd.grad(loss, logprobs)

    ref_lp = logprobs.detach().clone().requires_grad_()
    ref_loss, ref_clip, ref_kl = reference_pg(ref_lp, behaviour, advantages, mask, total)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_lp)

    assert 0.05 < ref_clip * total / mask.sum() < 0.95  # both branches exercised
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert float(metrics["clip_frac"]) == pytest.approx(ref_clip)
    assert float(metrics["mismatch_kl"]) == pytest.approx(ref_kl, rel=1e-4)


def test_clipped_tokens_get_no_gradient_and_masked_tokens_none_at_all() -> None:
    logprobs = torch.tensor([0.0, 0.0, 0.0, -50.0], requires_grad=True)
    behaviour = torch.tensor([-1.0, -1.0, 0.0, 0.0])  # ratios e, e, 1, (masked)
    advantages = torch.tensor([1.0, -1.0, 1.0, 1.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    loss, metrics = policy_gradient_loss(
        logprobs, behaviour, advantages, mask, clip_low=0.2, clip_high=0.28, total_tokens=3
    )
    loss.backward()
    assert logprobs.grad is not None
    # token 0: A > 0 and ratio above 1 + clip_high → clipped, no gradient
    # token 1: A < 0 and ratio above the bound → the unclipped (pessimistic) branch, -ratio·A
    # token 2: ratio 1 → -A; token 3: masked
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, math.e / 3, -1 / 3, 0.0]))
    assert float(metrics["clip_frac"]) == pytest.approx(1 / 3)


def test_loss_normalises_by_the_steps_total_tokens_so_micro_batches_add_up() -> None:
    logprobs, behaviour, advantages, mask = make_tokens(100, seed=1)
    total = int(mask.sum())
    kw = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "total_tokens": total}
    whole, _ = policy_gradient_loss(logprobs, behaviour, advantages, mask, **kw)
    a, _ = policy_gradient_loss(logprobs[:40], behaviour[:40], advantages[:40], mask[:40], **kw)
    b, _ = policy_gradient_loss(logprobs[40:], behaviour[40:], advantages[40:], mask[40:], **kw)
    torch.testing.assert_close(a + b, whole)


def test_mismatch_kl_is_zero_on_policy() -> None:
    behaviour = -torch.rand(50)
    _, metrics = policy_gradient_loss(
        behaviour.clone(),
        behaviour,
        torch.randn(50),
        torch.ones(50),
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        total_tokens=50,
    )
    assert float(metrics["mismatch_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(metrics["clip_frac"]) == 0.0


def test_sft_loss_is_masked_negative_log_likelihood() -> None:
    logprobs = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    mask = torch.tensor([0.0, 1.0, 1.0, 0.0])
    loss, metrics = sft_loss(logprobs, mask, total_tokens=4)
    assert loss.item() == pytest.approx((2.0 + 3.0) / 4)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, -0.25, -0.25, 0.0]))
    assert float(metrics["nll"]) == pytest.approx(1.25)


def test_token_entropy_of_uniform_is_log_vocab() -> None:
    logprobs_all = torch.log_softmax(torch.zeros(3, 8), dim=-1)
    torch.testing.assert_close(token_entropy(logprobs_all), torch.full((3,), math.log(8)))
