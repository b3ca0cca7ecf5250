"""Optimizer-state offload inside the real trainer step: same training, and checkpoints resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tidal.batch.tensors import MicroBatchData
from tidal.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.train_step import Trainer

TINY = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)


def trainer(**optim: object) -> Trainer:
    config = TrainerConfig(
        model=TINY, optim=OptimConfig.model_validate({"lr": 3e-3, **optim}), device="cpu"
    )
    return Trainer(config, seed=0, device=torch.device("cpu"))


OFFLOADS = [{"optim_cpu_offload": True}, {"optim_offload": "disk"}]


@pytest.mark.parametrize("offload", OFFLOADS, ids=["cpu", "disk"])
def test_offloaded_trainer_trains_like_the_plain_one(
    offload: dict, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    plain, offloaded = trainer(), trainer(**offload)
    for step in range(1, 4):
        expected = plain.train_step(step, step_batches(step), "pg")
        got = offloaded.train_step(step, step_batches(step), "pg")
        assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    for a, b in zip(plain.model.parameters(), offloaded.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("offload", OFFLOADS, ids=["cpu", "disk"])
def test_offloaded_optimizer_resumes_from_a_checkpoint(
    tmp_path: Path, offload: dict, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    straight = trainer(**offload)
    for step in range(1, 5):
        straight.train_step(step, step_batches(step), "pg")
    first = trainer(**offload)
    manager = CheckpointManager(tmp_path, keep_last=1)
    for step in range(1, 3):
        first.train_step(step, step_batches(step), "pg")
    manager.save(first)
    resumed = trainer(**offload)
    manager.load(resumed)
    for step in range(3, 5):
        resumed.train_step(step, step_batches(step), "pg")
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
