"""Leaving zero-advantage samples out of the forward is the same update: with and without
the skip a step gives the same loss, gradients and weights (bit for bit where the kept
micro-batches are the same, to float rounding where the skip joins them), on every loss
setting where it applies; where a term without the advantage is on, every sample trains."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed, validate_micro_batch
from tidal.trainer.config import TrainerConfig
from tidal.trainer.train_step import Trainer
from tidal.trainer.zero_advantage import skip_is_exact, trained_batches

SHAPE: dict[str, Any] = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                         "ffn_dim": 64, "max_seq_len": 64}  # fmt: skip
EXACT: dict[str, dict[str, Any]] = {
    "token": {},
    "sequence": {"norm": "sequence"},
    "constant": {"norm": "constant", "norm_constant": 30.0},
    "gspo-decoupled-tis-mis": {"ratio_level": "sequence", "norm": "sequence",
                               "objective": "decoupled", "tis_cap": 2.0,
                               "trust_region": {"ratio_low": 0.05, "geo_ratio_low": 0.02,
                                                "sequence_ratio_high": 20.0}},
}  # fmt: skip
NOT_EXACT: dict[str, dict[str, Any]] = {
    "kl": {"kl": {"coef": 0.1}},
    "entropy": {"entropy_coef": 0.01},
}


def groups(
    completions: int, *, zero: set[int], seed: int = 0, length: int = 0
) -> list[TrainSample]:
    """Four prompts × `completions`; the groups in `zero` have advantage 0 everywhere.
    `length` > 0: every prompt and completion that long."""
    g = random.Random(seed)
    samples = []
    for group in range(4):
        prompt = tuple(g.randrange(256) for _ in range(length or g.randrange(3, 9)))
        for _ in range(completions):
            n = length or g.randrange(2, 8)
            samples.append(
                TrainSample(
                    prompt,
                    tuple(g.randrange(256) for _ in range(n)),
                    advantage=0.0 if group in zero else g.uniform(-1, 1),
                    completion_logprobs=tuple(-g.uniform(0.5, 4) for _ in range(n)),
                    completion_versions=(0,) * n,
                )
            )
    return samples


def packed(samples: list[TrainSample], *, share: bool, budget: int) -> list[MicroBatchData]:
    (per_rank,) = pack_for_ranks(samples, budget, 1, share_prompts=share)
    return [micro_batch_from_packed(p) for p in per_rank]


def trainer(loss: dict[str, Any], *, skip: bool) -> Trainer:
    config = TrainerConfig.model_validate(
        {
            "model": {"family": "qwen2", **SHAPE},
            "loss": {**loss, "skip_zero_advantage": skip},
            "device": "cpu",
            "precision": "fp32",
        }
    )
    return Trainer(config, seed=0, device=torch.device("cpu"))


def two_steps(loss: dict[str, Any], steps: list[list[MicroBatchData]], *, skip: bool) -> tuple:
    """(first step's gradients, every step's metrics, weights after the steps)."""
    t = trainer(loss, skip=skip)
    t.compute_gradients(steps[0], "pg")
    grads = {n: p.grad.clone() for n, p in t.model.named_parameters()}
    metrics = [t.train_step(i, batches, "pg") for i, batches in enumerate(steps, 1)]
    return grads, metrics, {n: p.detach().clone() for n, p in t.model.named_parameters()}


@pytest.mark.parametrize("loss", sorted(EXACT))
def test_skipping_keeps_the_update_bit_for_bit_when_micro_batches_stay(loss: str) -> None:
    """Equal-length samples, one per micro-batch: the kept ones cannot be joined, so the
    skip removes micro-batches whose gradient is exactly zero."""
    samples = groups(2, zero={1, 3}, length=5)
    batches = packed(samples, share=False, budget=10)
    assert len(batches) == 8
    grads_a, metrics_a, weights_a = two_steps(EXACT[loss], [batches, batches], skip=False)
    grads_b, metrics_b, weights_b = two_steps(EXACT[loss], [batches, batches], skip=True)
    assert metrics_b[0]["zero_adv_skipped_samples"] == 4
    assert metrics_b[0]["zero_adv_skipped_tokens"] == 40
    assert metrics_b[0]["loss"] == metrics_a[0]["loss"]
    for name, g in grads_a.items():
        assert torch.equal(grads_b[name], g), name
    for name, w in weights_a.items():
        assert torch.equal(weights_b[name], w), name


@pytest.mark.parametrize("loss", sorted(EXACT))
def test_skipping_with_shared_prompts_and_joined_micro_batches_is_the_same_update(
    loss: str,
) -> None:
    samples = groups(3, zero={0, 2})
    batches = packed(samples, share=True, budget=40)
    trained, skipped = trained_batches(batches, keep_micro_batches=False)
    assert len(trained) < len(batches) and skipped.samples == 6
    for b in trained:  # still a valid micro-batch: parents re-indexed, positions unchanged
        validate_micro_batch(b, field="mb", vocab_size=264, max_seq_len=64)
        assert b.num_tokens <= max(x.num_tokens for x in batches)
    grads_a, metrics_a, weights_a = two_steps(EXACT[loss], [batches, batches], skip=False)
    grads_b, metrics_b, weights_b = two_steps(EXACT[loss], [batches, batches], skip=True)
    assert metrics_b[0]["loss"] == pytest.approx(metrics_a[0]["loss"], rel=1e-6, abs=1e-8)
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, rtol=1e-5, atol=1e-7, msg=name)
    for name, w in weights_a.items():  # AdamW: see test_shared_prompts.WEIGHT_ATOL
        torch.testing.assert_close(weights_b[name], w, rtol=1e-5, atol=1e-5, msg=name)


def test_a_step_with_every_advantage_zero_still_steps_adamw_on_its_momentum() -> None:
    first = packed(groups(2, zero=set()), share=True, budget=64)
    flat = packed(groups(2, zero={0, 1, 2, 3}, seed=1), share=True, budget=64)
    _, metrics_a, weights_a = two_steps({}, [first, flat], skip=False)
    _, metrics_b, weights_b = two_steps({}, [first, flat], skip=True)
    assert metrics_b[1]["zero_adv_skipped_samples"] == 8
    assert metrics_b[1]["loss"] == 0.0 and metrics_b[1]["grad_norm"] == 0.0
    assert metrics_a[1]["grad_norm"] == 0.0
    for name, w in weights_a.items():
        assert torch.equal(weights_b[name], w), name
    moved = trainer({}, skip=True)
    moved.train_step(1, first, "pg")
    before = {n: p.detach().clone() for n, p in moved.model.named_parameters()}
    moved.train_step(2, flat, "pg")
    assert any(not torch.equal(before[n], p) for n, p in moved.model.named_parameters())


@pytest.mark.parametrize("loss", sorted(NOT_EXACT))
def test_every_sample_trains_where_a_term_without_the_advantage_is_on(loss: str) -> None:
    config = TrainerConfig.model_validate({"model": SHAPE, "loss": NOT_EXACT[loss]})
    assert not skip_is_exact(config, "pg", cp=1)
    batches = packed(groups(2, zero={1}), share=True, budget=64)
    metrics = trainer(NOT_EXACT[loss], skip=True).train_step(1, batches, "pg")
    assert "zero_adv_skipped_samples" not in metrics


def test_only_policy_gradient_steps_of_dense_models_without_context_parallelism_skip() -> None:
    config = TrainerConfig.model_validate({"model": SHAPE})
    assert skip_is_exact(config, "pg", cp=1)
    assert not skip_is_exact(config, "sft", cp=1)
    assert not skip_is_exact(config, "pg", cp=2)
    moe = TrainerConfig.model_validate({"model": {**SHAPE, "family": "qwen3_moe"}})
    assert not skip_is_exact(moe, "pg", cp=1)
    off = TrainerConfig.model_validate({"model": SHAPE, "loss": {"skip_zero_advantage": False}})
    assert not skip_is_exact(off, "pg", cp=1)


def test_ranks_that_run_every_micro_batch_keep_one_out_per_one_in() -> None:
    samples = groups(2, zero={0, 1})
    one_group_each = [packed(samples[i : i + 2], share=True, budget=64)[0] for i in (0, 2, 4, 6)]
    mixed = packed(samples[2:6], share=True, budget=64)  # a zero group beside a trained one
    batches = [*one_group_each, *mixed]
    trained, skipped = trained_batches(batches, keep_micro_batches=True)
    assert len(trained) == len(batches)
    assert trained[0] is batches[0] and trained[1] is batches[1]  # nothing left: kept whole
    assert trained[-1].num_tokens < batches[-1].num_tokens
    assert skipped.samples == 2
