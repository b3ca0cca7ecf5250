"""Mismatch and staleness are measured apart, on real engine outputs and real trainer steps.

The native engine (fp32) serves the trainer's published version 0 and samples completions;
the orchestrator's packing turns them into a micro-batch carrying each token's version,
and the trainer trains on it. Sampled by the weights the trainer holds (`max_async = 0`),
the tokens' behaviour and trainer logprobs differ only by float rounding; a step later
the same tokens are one version stale and only the staleness metrics see the gap.
"""

from __future__ import annotations

import pytest
import torch

from tidal.batch.packing import TrainSample, build_micro_batch
from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.train_step import Trainer

TINY = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=48)


async def engine_batch(trainer: Trainer) -> MicroBatchData:
    """Completions of the trainer's current weights, sampled by an fp32 engine serving them
    as version 0, packed as the orchestrator packs them (advantage ±1 per sample)."""
    engine = NativeEngine(
        device=torch.device("cpu"),
        seed=0,
        max_batch_size=16,
        max_queue=16,
        max_step_tokens=512,
        kv_cache_mb=8,
        dtype=torch.float32,
    )
    await engine.start()
    try:
        await engine.update_weights(0, trainer.hf_config(), trainer.state_dict_for_publish())
        prompt = [256, 72, 105, 33]
        params = SamplingParams(max_tokens=20, temperature=1.0, n=6, seed=7)
        completions = [c async for c in engine.generate(prompt, params)]
    finally:
        await engine.close()
    samples = [
        TrainSample(
            prompt_ids=tuple(prompt),
            completion_ids=tuple(c.token_ids),
            advantage=1.0 if c.index % 2 else -1.0,
            completion_logprobs=tuple(c.logprobs),
            completion_versions=tuple(c.policy_versions),
        )
        for c in completions
    ]
    assert all(v == 0 for s in samples for v in s.completion_versions)
    return micro_batch_from_packed(build_micro_batch(samples))


async def test_fp32_engine_on_the_trainers_version_has_no_mismatch_and_stale_tokens_are_apart() -> (
    None
):
    trainer = Trainer(
        TrainerConfig(model=TINY, optim={"lr": 0.05}, device="cpu", precision="fp32"),
        seed=0,
        device=torch.device("cpu"),
    )
    batch = await engine_batch(trainer)

    fresh = trainer.train_step(1, [batch], "pg")  # the trainer holds version 0: staleness 0
    assert fresh["staleness_share/0"] == pytest.approx(1.0)
    assert fresh["mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
    assert fresh["behaviour_kl"] == pytest.approx(0.0, abs=1e-6)
    assert not any(k.startswith("stale_kl/") for k in fresh)

    stale = trainer.train_step(2, [batch], "pg")  # the same tokens, now one version behind
    assert stale["staleness_share/1"] == pytest.approx(1.0)
    assert "mismatch_kl" not in stale
    assert stale["stale_kl/1"] > 1e-4
    assert stale["stale_kl/1"] == pytest.approx(stale["behaviour_kl"])
