"""Training each group's prompt once is the same step: packed with shared prompts or
without, a step gives the same loss, metrics, gradients and updated weights (fp32), on
every model family and with the levers that compose (normalizations, chunked LM head, KL
reference, off-policy corrections, entropy bonus, MoE router loss, SFT) and advantages
that vary per token; the settings that do not compose are refused by name before any
forward."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed, validate_micro_batch
from tidal.common.errors import InvalidArgument
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.memory_config import TruncationConfig
from tidal.trainer.ranks import SingleProcess
from tidal.trainer.shared_prompts import shared_prompt_conflicts
from tidal.trainer.train_step import Trainer

SHAPE: dict[str, Any] = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                         "ffn_dim": 64, "max_seq_len": 64}  # fmt: skip
MOE: dict[str, Any] = {"n_experts": 4, "n_experts_per_tok": 2, "moe_ffn_dim": 16,
                       "router_aux_loss_coef": 0.05}  # fmt: skip
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": MOE,
    "qwen2_moe": {**MOE, "shared_expert_ffn_dim": 24},
}
LEVERS: dict[str, dict[str, Any]] = {
    "token": {},
    "sequence+kl": {"loss": {"norm": "sequence", "kl": {"coef": 0.1}}},
    "constant+entropy": {"loss": {"norm": "constant", "norm_constant": 30.0,
                                  "entropy_coef": 0.01}},
    "off-policy": {"loss": {"objective": "decoupled", "tis_cap": 2.0, "ratio_level": "sequence",
                            "trust_region": {"ratio_low": 0.01, "geo_ratio_low": 0.02,
                                             "sequence_ratio_high": 5.0,
                                             "max_prob_diff": 0.3}}},
    "chunked-head": {"model": {"fused_lm_head_token_chunk_size": 7}},
}  # fmt: skip
IGNORED = {"tokens", "seconds", "tokens_per_s"}  # the shared row has fewer tokens
# AdamW's first step moves a weight by lr·g/(|g| + eps): where |g| is near eps (1e-8) a
# gradient's last-bit rounding moves the update by a part of lr (1e-3), so updated weights
# are compared to 1 % of lr.
WEIGHT_ATOL = 1e-5


def group_samples(seed: int = 0) -> list[TrainSample]:
    """Two prompts with three and two completions, and one prompt with one; advantages
    vary per token."""
    g = random.Random(seed)
    samples = []
    for prompt_len, completions in ((9, 3), (5, 2), (4, 1)):
        prompt = tuple(g.randrange(256) for _ in range(prompt_len))
        for _ in range(completions):
            n = g.randrange(2, 7)
            samples.append(
                TrainSample(
                    prompt,
                    tuple(g.randrange(256) for _ in range(n)),
                    advantage=g.uniform(-1, 1),
                    completion_logprobs=tuple(-g.uniform(0.5, 4) for _ in range(n)),
                    completion_versions=(0,) * n,
                    token_advantages=tuple(g.uniform(-0.5, 0.5) for _ in range(n)),
                )
            )
    return samples


def packed(samples: list[TrainSample], *, share: bool, budget: int = 256) -> list[MicroBatchData]:
    (per_rank,) = pack_for_ranks(samples, budget, 1, share_prompts=share)
    batches = [micro_batch_from_packed(p) for p in per_rank]
    for b in batches:
        validate_micro_batch(b, field="mb", vocab_size=264, max_seq_len=64)
    return batches


def trainer(family: str, lever: dict[str, Any]) -> Trainer:
    model = {"family": family, **SHAPE, **FAMILIES[family], **lever.get("model", {})}
    config = TrainerConfig.model_validate(
        {"model": model, "loss": lever.get("loss", {}), "device": "cpu", "precision": "fp32"}
    )
    return Trainer(config, seed=0, device=torch.device("cpu"))


def step(family: str, lever: dict[str, Any], batches: list[MicroBatchData], kind: str) -> tuple:
    """(metrics, gradients) of the step's gradients, then (metrics, weights) after it."""
    t = trainer(family, lever)
    sums = {k: float(v) for k, v in t.compute_gradients(batches, kind).items()}  # type: ignore[arg-type]
    grads = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    metrics = t.train_step(1, batches, kind)  # type: ignore[arg-type]
    weights = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    return sums, grads, metrics, weights


def assert_same_step(family: str, lever: dict[str, Any], kind: str = "pg") -> None:
    """One micro-batch either way: the router loss is pooled per micro-batch."""
    samples = group_samples()
    shared = packed(samples, share=True)
    assert any(b.sample_parents is not None for b in shared)
    assert sum(b.num_tokens for b in shared) < sum(
        b.num_tokens for b in packed(samples, share=False)
    )
    sums_a, grads_a, metrics_a, weights_a = step(family, lever, packed(samples, share=False), kind)
    sums_b, grads_b, metrics_b, weights_b = step(family, lever, shared, kind)
    assert sums_a.keys() == sums_b.keys()
    for name in sums_a:
        assert sums_b[name] == pytest.approx(sums_a[name], rel=1e-5, abs=1e-6), name
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert metrics_a.keys() == metrics_b.keys()
    for name in metrics_a.keys() - IGNORED:
        assert metrics_b[name] == pytest.approx(metrics_a[name], rel=1e-5, abs=1e-6), name
    for name, w in weights_a.items():
        torch.testing.assert_close(weights_b[name], w, rtol=1e-5, atol=WEIGHT_ATOL, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_shared_prompts_give_the_same_step_on_every_family(family: str) -> None:
    assert_same_step(family, LEVERS["sequence+kl"])


@pytest.mark.parametrize("lever", sorted(LEVERS))
def test_shared_prompts_give_the_same_step_with_each_lever(lever: str) -> None:
    assert_same_step("qwen3_moe", LEVERS[lever])


def test_shared_prompts_give_the_same_step_with_transformers_models() -> None:
    pytest.importorskip("transformers")
    assert_same_step("qwen2", {"model": {"impl": "hf"}})


def test_shared_prompts_give_the_same_sft_step() -> None:
    assert_same_step("qwen3", {}, kind="sft")


def test_a_group_split_over_micro_batches_gives_the_same_step() -> None:
    samples = group_samples()
    assert len(packed(samples, share=True, budget=24)) > 1
    unshared = step("llama", {}, packed(samples, share=False, budget=24), "pg")
    shared = step("llama", {}, packed(samples, share=True, budget=24), "pg")
    for name, w in unshared[3].items():
        torch.testing.assert_close(shared[3][name], w, rtol=1e-5, atol=WEIGHT_ATOL, msg=name)


def test_truncation_refuses_shared_prompts_by_name_before_training() -> None:
    t = trainer("llama", {})
    t.config.model.truncation = TruncationConfig(max_completion_tokens=4)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    with pytest.raises(InvalidArgument, match=r"truncation\.max_completion_tokens = 4"):
        t.train_step(1, packed(group_samples(), share=True), "pg")
    assert all(torch.equal(p, before[n]) for n, p in t.model.named_parameters())
    assert t.train_step(1, packed(group_samples(), share=False), "pg")["loss_tokens"] > 0


def test_context_parallelism_refuses_shared_prompts_before_any_forward() -> None:
    config = TrainerConfig(model=ModelConfig(**SHAPE), device="cpu")
    t = Trainer(config, seed=0, device=torch.device("cpu"), ranks=SingleProcess(cp=2))
    with pytest.raises(InvalidArgument, match=r"trainer\.parallel\.cp = 2") as info:
        t.train_step(1, packed(group_samples(), share=True), "pg")
    assert "share_prompts = false" in str(info.value) and t.trained_step == 0


def test_context_parallelism_and_flash_attention_are_named_as_conflicts() -> None:
    config = TrainerConfig(model=ModelConfig(**SHAPE), device="cpu")
    assert shared_prompt_conflicts(config, cp=1) == []
    (conflict,) = shared_prompt_conflicts(config, cp=2)
    assert "trainer.parallel.cp = 2" in conflict
    flash = config.model_copy(
        update={"model": config.model.model_copy(update={"attn": "flash_attention_2"})}
    )
    assert any("flash_attention_2" in c for c in shared_prompt_conflicts(flash, cp=1))
