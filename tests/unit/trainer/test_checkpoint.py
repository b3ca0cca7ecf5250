"""Checkpoints: exact resume in-process, retention, and no half-written checkpoint ever counts."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tidal.batch.tensors import MicroBatchData
from tidal.trainer import checkpoint_files
from tidal.trainer.checkpoint import CheckpointManager, TrainState
from tidal.trainer.config import ModelConfig, OptimConfig, ScheduleConfig, TrainerConfig
from tidal.trainer.safe_dcp import UnsafeCheckpoint
from tidal.trainer.train_step import Trainer

TINY = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
SCHEDULE = ScheduleConfig(warmup_steps=2, decay="cosine", decay_steps=4)
CONFIG = TrainerConfig(model=TINY, optim=OptimConfig(lr=3e-3, schedule=SCHEDULE), device="cpu")


def new_trainer() -> Trainer:
    return Trainer(CONFIG, seed=0, device=torch.device("cpu"))


def params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def test_resuming_from_a_checkpoint_continues_bitwise_identically(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    straight = new_trainer()
    for step in range(1, 5):
        straight.train_step(step, step_batches(step), "pg")

    first = new_trainer()
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 3):
        first.train_step(step, step_batches(step), "pg")
    torch.manual_seed(1234)  # the RNG state is part of the checkpoint
    manager.save(first, extra={"data_position": 6})
    expected_rng = torch.get_rng_state()

    torch.manual_seed(999)
    resumed = new_trainer()
    assert manager.load(resumed) == {"data_position": 6}
    assert resumed.trained_step == 2
    assert torch.equal(torch.get_rng_state(), expected_rng)
    for step in range(3, 5):
        resumed.train_step(step, step_batches(step), "pg")

    a, b = params(straight), params(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert resumed.scheduler.last_epoch == straight.scheduler.last_epoch == 4


def test_only_the_newest_keep_last_checkpoints_are_kept(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    trainer = new_trainer()
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 5):
        trainer.train_step(step, step_batches(step), "sft")
        manager.save(trainer)
    assert [step for step, _ in manager.complete()] == [3, 4]
    assert manager.latest() == tmp_path / "step_00000004"


def save_step_1_then_crash_while_saving_step_2(
    root: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    """Run in a child process: the power goes out once step 2's data is written."""
    trainer = new_trainer()
    manager = CheckpointManager(root, keep_last=2)
    trainer.train_step(1, step_batches(1), "sft")
    manager.save(trainer)
    trainer.train_step(2, step_batches(2), "sft")
    real_write = checkpoint_files.write_state

    def write_then_die(*args: object, **kwargs: object) -> None:
        real_write(*args, **kwargs)  # type: ignore[arg-type]
        os._exit(17)

    checkpoint_files.write_state = write_then_die  # type: ignore[assignment]
    manager.save(trainer)


@pytest.mark.slow
def test_a_crash_mid_save_never_leaves_a_checkpoint_that_looks_complete(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    root = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, __file__, str(root)], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 17, done.stderr.decode()
    leftovers = [p.name for p in root.iterdir()]
    assert "step_00000001" in leftovers and "step_00000002" not in leftovers
    assert any(name.startswith(".tmp-step_00000002") for name in leftovers)  # the torn write

    manager = CheckpointManager(root, keep_last=2)
    assert manager.latest() == root / "step_00000001"
    trainer = new_trainer()
    manager.load(trainer)
    assert trainer.trained_step == 1
    trainer.train_step(2, step_batches(2), "sft")
    manager.save(trainer)  # the next save clears the torn temp folder
    assert sorted(p.name for p in root.iterdir()) == ["step_00000001", "step_00000002"]


def test_loading_from_an_empty_folder_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        CheckpointManager(tmp_path, keep_last=1).load(new_trainer())


def test_a_damaged_checkpoint_file_is_refused_naming_it(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    trainer = new_trainer()
    trainer.train_step(1, step_batches(1), "sft")
    folder = CheckpointManager(tmp_path, keep_last=1).save(trainer)
    [state] = folder.iterdir()  # one safetensors file: no pickle in a one-process checkpoint
    assert checkpoint_files.NAME.match(state.name)
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(checkpoint_files.CorruptCheckpoint, match=f"{state.name} is damaged"):
        CheckpointManager(tmp_path, keep_last=1).load(new_trainer())


class _RunsCode:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch planted",))


def test_a_dcp_checkpoint_loads_safely_and_planted_pickles_never_run(
    tmp_path: Path,
    step_batches: Callable[[int], list[MicroBatchData]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A multi-rank (DCP) checkpoint loads into one process through the allowlisted
    reader; a `.metadata` that names any other code is refused before it runs."""
    trainer = new_trainer()
    trainer.train_step(1, step_batches(1), "sft")
    folder = tmp_path / "step_00000001"
    dcp.save({"train": TrainState(trainer, {"pos": 3})}, checkpoint_id=folder)
    resumed = new_trainer()
    assert CheckpointManager(tmp_path, keep_last=1).load(resumed) == {"pos": 3}
    assert resumed.trained_step == 1
    a, b = params(trainer), params(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)

    (folder / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafeCheckpoint, match=r"refers to (posix|os)\.system.*refusing to load"):
        CheckpointManager(tmp_path, keep_last=1).load(new_trainer())
    assert not (tmp_path / "planted").exists()


if __name__ == "__main__":
    from conftest import batches_for  # run as a script: this folder is on sys.path

    save_step_1_then_crash_while_saving_step_2(Path(sys.argv[1]), batches_for)
