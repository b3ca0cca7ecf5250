"""Checkpoints: exact resume in-process, retention, and no half-written checkpoint ever counts."""

from __future__ import annotations

import io
import json
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
from tidal.trainer.config import ModelConfig, OptimConfig, ScheduleConfig, TrainerConfig
from tidal.trainer.persistence import state_file
from tidal.trainer.persistence.checkpoint import CheckpointManager, TrainState
from tidal.trainer.persistence.safe_dcp import UnsafeCheckpoint
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
    real_write = state_file.write_state

    def write_then_die(*args: object, **kwargs: object) -> None:
        real_write(*args, **kwargs)  # type: ignore[arg-type]
        os._exit(17)

    state_file.write_state = write_then_die  # type: ignore[assignment]
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
    assert state_file.NAME.match(state.name)
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(state_file.CorruptCheckpoint, match=f"{state.name} is damaged"):
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


class _ByName:
    """Pickles as `getattr(owner, name)`: how Python 3.12+ (and Debian's 3.11) write an
    enum member, such as DCP's memory-format code in every tensor's properties."""

    def __init__(self, owner: object, name: str) -> None:
        self.owner, self.name = owner, name

    def __reduce__(self) -> tuple[object, tuple[object, str]]:
        return (getattr, (self.owner, self.name))


def test_an_enum_member_pickled_by_name_loads_and_no_other_attribute_does() -> None:
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from tidal.trainer.persistence.safe_dcp import _MetadataUnpickler

    def load(obj: object) -> object:
        return _MetadataUnpickler(io.BytesIO(pickle.dumps(obj))).load()

    member = _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    assert load(_ByName(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")) is member
    with pytest.raises(UnsafeCheckpoint, match="no enum member"):
        load(_ByName(_MEM_FORMAT_ENCODING, "__class__"))
    with pytest.raises(UnsafeCheckpoint, match="no enum member"):
        load(_ByName(torch.Size, "__reduce__"))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # run as a script: the conftest's
    from conftest import batches_for

    save_step_1_then_crash_while_saving_step_2(Path(sys.argv[1]), batches_for)


def test_the_streamed_state_file_matches_safetensors_own(tmp_path: Path) -> None:
    """`write_state` streams the tensors into the file (no state-sized buffer); the file
    must be the one safetensors itself writes for its tensors and metadata: same tensor
    entries in the same order, same bytes after the header, same metadata, and read back
    the same."""
    from safetensors import safe_open
    from safetensors.torch import load, save

    tied = torch.randn(5, 4)
    state = {
        "model": {"emb": tied, "head": tied, "b": torch.randn(3, dtype=torch.bfloat16)},
        "optim": {"step": torch.tensor(3.0), "m": torch.randn(2, 3)[:, 1:]},  # a view
        "ids": torch.arange(4), "empty": torch.zeros(0), "mask": torch.ones(2, dtype=torch.bool),
        "sched": {"last_epoch": 3, "lrs": (0.1, 0.2)}, "extra": "{}",
    }  # fmt: skip
    state_file.write_state(tmp_path, state)
    path = state_file.state_file(tmp_path)
    assert path is not None and [p.name for p in tmp_path.iterdir()] == [path.name]
    streamed = path.read_bytes()
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    reference = save(load(streamed), metadata=metadata)

    def parts(data: bytes) -> tuple[list[tuple[str, object]], dict[str, str], bytes]:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        metadata = header.pop("__metadata__")
        return list(header.items()), metadata, data[8 + size :]

    assert parts(streamed) == parts(reference)
    with safe_open(path, framework="pt") as f:  # safetensors' own reader takes it
        assert torch.equal(f.get_tensor("/model/b"), state["model"]["b"])
    back = state_file.read_state(tmp_path)  # checks the name's sha256
    assert back["model"]["head"] is back["model"]["emb"]
    assert torch.equal(back["optim"]["m"], state["optim"]["m"])
    assert back["sched"] == {"last_epoch": 3, "lrs": (0.1, 0.2)}


def test_a_snapshot_written_later_holds_the_state_it_was_taken_at(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    """Background writes capture the state when step n ends and write it while step
    n+1's forward/backward run (which set the optimizer's lr): the written checkpoint is
    step n's, the same as a plain save then."""
    trainer = new_trainer()
    trainer.train_step(1, step_batches(1), "pg")
    manager = CheckpointManager(tmp_path / "snap", keep_last=1)
    write_snapshot = manager.capture(trainer, extra={"data_position": 1})
    reference = CheckpointManager(tmp_path / "plain", keep_last=1).save(trainer)
    trainer._set_lr("pg")  # as step 2 does before its forward
    trainer.optimizer.param_groups[0]["lr"] = 123.0
    torch.manual_seed(5)
    written = write_snapshot()
    saved = state_file.read_state(written)["train"]
    plain = state_file.read_state(reference)["train"]
    assert saved["step"] == plain["step"] == 1
    assert saved["optim"]["param_groups"] == plain["optim"]["param_groups"]
    assert saved["scheduler"] == plain["scheduler"]
    assert torch.equal(saved["rng"]["cpu"], plain["rng"]["cpu"])
    assert all(torch.equal(saved["model"][k], v) for k, v in plain["model"].items())


def test_a_dcp_save_that_finds_the_disk_full_raises_disk_full(tmp_path: Path) -> None:
    """Under a process group checkpoints are DCP's, which wraps each rank's error in a
    CheckpointException (a BaseException, out of the error's chain): a full disk still
    surfaces as `DiskFull` naming the folder, and no checkpoint counts."""
    import torch.distributed as dist

    from tidal.common.errors import DiskFull

    from ....helpers.small_disk import small_disk  # here: this module also runs as a script

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        with small_disk(tmp_path / "disk", "64k") as disk:
            manager = CheckpointManager(disk / "checkpoints", keep_last=2)
            with pytest.raises(DiskFull, match=r"^disk full: .*checkpoints") as err:
                manager.save(new_trainer())
            assert str(disk) in str(err.value)
            assert manager.complete() == []
    finally:
        dist.destroy_process_group()
