"""The launcher's decision to restart a crashed trainer, from what the trainer left on disk
(written by the trainer's own journal, state-file and version writers): a restart that
loses no trained step goes ahead, one that would lose a published step is refused
naming the steps, the checkpoint and the journal."""

from __future__ import annotations

from pathlib import Path

import torch

from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData
from tidal.cli.config import RunConfig
from tidal.cli.launcher import trainer_cannot_resume
from tidal.cli.trainer_resume import resume_point
from tidal.common.config.loading import load_config
from tidal.trainer.persistence.journal import StepJournal
from tidal.trainer.persistence.state_file import write_step_folder
from tidal.trainer.sft import pack_for_trainer
from tidal.weights.folder import write_version

ROOT = Path(__file__).resolve().parents[3]


def run_config(output_dir: Path) -> RunConfig:
    argv = ["@", str(ROOT / "configs" / "default.toml"), "--run.output-dir", str(output_dir),
            "--run.name", "r"]  # fmt: skip
    return load_config(RunConfig, argv, environ={})[0]


def batches() -> list[MicroBatchData]:
    sample = TrainSample((256, 1, 2), (3, 4), advantage=0.5, completion_logprobs=(-1.0, -2.0))
    return pack_for_trainer([sample], 16)


def journal(ckpt_dir: Path, *steps: int) -> None:
    for step in steps:
        StepJournal(ckpt_dir).append(step, batches(), "pg", bytes(32))


def checkpoint(ckpt_dir: Path, step: int) -> None:
    write_step_folder(ckpt_dir, step, {"step": step, "w": torch.zeros(2)})


def publish(weights_dir: Path, *versions: int) -> None:
    for v in versions:
        write_version(weights_dir, version=v, step=v, state_dict={"w": torch.zeros(2)}, config={})


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    run = run_config(tmp_path).run.dir
    return run / "checkpoints", run / "weights"


def test_a_trainer_that_trained_nothing_restarts_from_its_initial_weights(tmp_path: Path) -> None:
    ckpt_dir, weights_dir = dirs(tmp_path)
    config = run_config(tmp_path)
    assert trainer_cannot_resume(config) is None  # killed before it published version 0
    publish(weights_dir, 0)
    assert resume_point(ckpt_dir, weights_dir).reached == 0
    assert trainer_cannot_resume(config) is None


def test_a_trainer_with_journal_entries_only_restarts_to_replay_them(tmp_path: Path) -> None:
    ckpt_dir, weights_dir = dirs(tmp_path)
    journal(ckpt_dir, 1, 2, 3)  # step 3 journaled, killed before its publish
    publish(weights_dir, 0, 1, 2)
    point = resume_point(ckpt_dir, weights_dir)
    assert (point.checkpoint, point.reached, point.published) == (0, 3, 2)
    assert trainer_cannot_resume(run_config(tmp_path)) is None


def test_journal_entries_after_a_checkpoint_are_replayed_up_to_a_gap(tmp_path: Path) -> None:
    ckpt_dir, weights_dir = dirs(tmp_path)
    checkpoint(ckpt_dir, 4)
    journal(ckpt_dir, 5, 6, 8)
    publish(weights_dir, 6)
    point = resume_point(ckpt_dir, weights_dir)
    assert (point.checkpoint, point.reached) == (4, 6)
    assert trainer_cannot_resume(run_config(tmp_path)) is None


def test_a_restart_that_would_lose_a_published_step_is_refused_naming_it(tmp_path: Path) -> None:
    ckpt_dir, weights_dir = dirs(tmp_path)
    checkpoint(ckpt_dir, 4)  # no journal (trainer.ckpt.journal off), versions 5 and 6 out
    publish(weights_dir, 4, 5, 6)
    refusal = trainer_cannot_resume(run_config(tmp_path))
    assert refusal is not None
    assert f"version 6 is published in {weights_dir}" in refusal
    assert f"{ckpt_dir} holds step 4" in refusal
    assert "steps 5..6 would be lost" in refusal
    assert "trainer.ckpt.journal" in refusal


def test_published_steps_without_any_checkpoint_or_journal_are_refused(tmp_path: Path) -> None:
    _, weights_dir = dirs(tmp_path)
    publish(weights_dir, 0, 1, 2)  # trainer.ckpt.interval = 0
    refusal = trainer_cannot_resume(run_config(tmp_path))
    assert refusal is not None
    assert "holds no checkpoint" in refusal and "steps 1..2 would be lost" in refusal
