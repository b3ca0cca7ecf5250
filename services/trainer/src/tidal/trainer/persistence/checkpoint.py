"""Checkpoints of the full training state: model, optimizer, LR schedule, RNG, step, and a
small `extra` the caller owns (SFT's data position, RL's payload fingerprint).

One process writes one state file (state_file.py); several ranks write with
torch.distributed.checkpoint (DCP), each rank its shards, rank 0 renaming after a barrier,
and DCP folders load through safe_dcp.py so no load runs pickled code. A checkpoint is a
`step_XXXXXXXX` folder renamed into place once complete, and only the newest `keep_last`
are kept. What is saved is a `TrainingState`, so rank 0's leader saves itself unwrapped.
A save that finds the disk full raises `DiskFull` on every rank, whichever rank's write failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from tidal.common.errors import DiskFull, free_bytes
from tidal.common.files.durable import as_disk_full, fsync_tree
from tidal.common.files.safe_remove import remove_inside
from tidal.trainer.persistence import state_file

log = logging.getLogger(__name__)


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"cuda{i}"] = s
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    cuda = [state[f"cuda{i}"] for i in range(torch.cuda.device_count()) if f"cuda{i}" in state]
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


class TrainingState(Protocol):
    """What a checkpoint holds of a trainer (the `Trainer`, or rank 0's `TorchrunLeader`)."""

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler: ...

    trained_step: int  # the last step whose optimizer step ran; set on load


DCP_MODULE = "torch.distributed.checkpoint.state_dict"
"""DCP and, through it, DTensor and sympy: imported where used, off the start-up path."""


class TrainState:
    """The trainer's state as one DCP `Stateful` (a runtime-checked protocol: the two
    methods make it one, so this module needs no DCP import); `extra` holds caller-owned
    ints."""

    def __init__(self, trainer: TrainingState, extra: dict[str, int] | None = None) -> None:
        self.trainer = trainer
        self.extra = dict(extra or {})

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        t = self.trainer
        model, optim = get_state_dict(t.model, t.optimizer)
        return {
            "model": model,
            "optim": optim,
            "scheduler": t.scheduler.state_dict(),
            "rng": _rng_state(),
            "step": t.trained_step,
            # One JSON string: DCP loads into the keys of the live state dict, and a fresh
            # process does not know the caller's keys yet; a single leaf it always has.
            "extra": json.dumps(self.extra, sort_keys=True),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        t = self.trainer
        set_state_dict(
            t.model,
            t.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        t.scheduler.load_state_dict(state_dict["scheduler"])
        _set_rng_state(state_dict["rng"])
        t.trained_step = int(state_dict["step"])
        self.extra = {k: int(v) for k, v in json.loads(state_dict["extra"]).items()}


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _shared_nonce() -> str:
    """A random folder suffix, rank 0's on every rank (all ranks write one checkpoint)."""
    nonce = [uuid.uuid4().hex[:8]]
    if dist.is_initialized():
        dist.broadcast_object_list(nonce, src=0)
    return nonce[0]


def _is_complete(path: Path) -> bool:
    return (path / ".metadata").is_file() or state_file.is_complete(path)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    """Silence DCP's warning that no process group exists: one process is a supported setup."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _copy_containers(tree: Any) -> Any:
    """`tree` with every dict, list and tuple copied and the tensors shared: the live
    tensors are read once, when the snapshot is written; the rest may change meanwhile
    (the next step sets the optimizer's `lr`)."""
    if isinstance(tree, dict):
        return {k: _copy_containers(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_copy_containers(v) for v in tree)
    return tree


def _local_bytes(tree: Any) -> int:
    """Bytes of the tensors in `tree` that this rank holds (a DTensor: its local shard)."""
    if isinstance(tree, torch.Tensor):
        local = tree.to_local() if hasattr(tree, "to_local") else tree
        return local.numel() * local.element_size()
    if isinstance(tree, dict):
        return sum(_local_bytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_local_bytes(v) for v in tree)
    return 0


def _save_failure(exc: BaseException, folder: Path, trainer: TrainingState) -> Exception:
    """A failed DCP save as an Exception: `DiskFull` when some rank's write found no space
    (DCP wraps each rank's error, out of the exception's chain; torch.save's zip writer
    reports ENOSPC as a RuntimeError without errno, so a filesystem left with less free
    space than this rank's share counts too), else a RuntimeError with DCP's report."""
    for error, _trace in getattr(exc, "failures", {}).values():
        full = as_disk_full(error, folder) if isinstance(error, Exception) else error
        if isinstance(full, DiskFull):
            return full
    needed = _local_bytes(trainer.model.state_dict()) + _local_bytes(
        trainer.optimizer.state_dict()["state"]
    )
    if free_bytes(folder) < needed:
        return DiskFull(folder, needed)
    return RuntimeError(f"checkpoint {folder} not written: {exc}")


class CheckpointManager:
    def __init__(self, root: Path, *, keep_last: int) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        self.root = root
        self.keep_last = keep_last
        self.loaded_extra: dict[str, int] = {}
        """The `extra` of the checkpoint last loaded (empty before any)."""

    def complete(self) -> list[tuple[int, Path]]:
        """(step, folder) of every complete checkpoint, oldest first."""
        return state_file.step_folders(self.root, _is_complete)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        done = self.complete()
        return done[-1][1] if done else None

    def capture(
        self, trainer: TrainingState, *, extra: dict[str, int] | None = None
    ) -> Callable[[], Path]:
        """The trainer's state at its current step, written when the returned call runs.

        One process: everything but the tensors is copied now (step, schedule, RNG,
        optimizer hyper-parameters), the tensors are the live ones, so weights and
        optimizer state must not change until the write returned. Several ranks: the
        write is the collective `save`, so nothing of the next step may run before it."""
        if dist.is_initialized():
            return lambda: self.save(trainer, extra=extra)
        step = trainer.trained_step
        state = _copy_containers(TrainState(trainer, extra).state_dict())
        return lambda: self._write_one_process(step, state)

    def save(self, trainer: TrainingState, *, extra: dict[str, int] | None = None) -> Path:
        """Write the trainer's state at its current step; returns the checkpoint folder."""
        if not dist.is_initialized():  # one process: our own format (module docstring)
            return self.capture(trainer, extra=extra)()
        step = trainer.trained_step
        tmp = state_file.temp_folder(self.root, step, _shared_nonce())
        if _is_rank0():
            self.root.mkdir(parents=True, exist_ok=True)
            state_file.remove_temps(self.root)
        _barrier()
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            dcp.save({"train": TrainState(trainer, extra)}, checkpoint_id=tmp)
        except CheckpointException as exc:  # a BaseException: every rank gets it
            raise _save_failure(exc, tmp, trainer) from None
        _barrier()
        if _is_rank0():
            fsync_tree(tmp)
            self._commit(tmp, step)
        _barrier()
        return self.root / f"step_{step:08d}"

    def _write_one_process(self, step: int, state: dict[str, Any]) -> Path:
        state_file.remove_temps(self.root)
        return self._saved(step, state_file.write_step_folder(self.root, step, {"train": state}))

    def _commit(self, tmp: Path, step: int) -> Path:
        return self._saved(step, state_file.commit_folder(tmp, self.root, step))

    def _saved(self, step: int, final: Path) -> Path:
        self._prune()
        log.info("checkpoint of step %d saved", step, extra={"fields": {"dir": str(final)}})
        return final

    def load(self, trainer: TrainingState, path: Path | None = None) -> dict[str, int]:
        """Restore `trainer` from `path` (default: the latest); returns the saved `extra`."""
        path = path or self.latest()
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint under {self.root}")
        if not _is_complete(path):
            raise FileNotFoundError(
                f"{path} is not a complete checkpoint (no .metadata or state file)"
            )
        state = TrainState(trainer)
        if state_file.is_complete(path):
            if dist.is_initialized() and dist.get_world_size() > 1:
                raise ValueError(
                    f"{path} was saved by one trainer process; a job of "
                    f"{dist.get_world_size()} ranks cannot load it (resume it with "
                    "trainer.world_size = 1)"
                )
            state.load_state_dict(state_file.read_state(path)["train"])
        else:
            import torch.distributed.checkpoint as dcp

            from tidal.trainer.persistence.safe_dcp import SafeFileSystemReader, SafeLoadPlanner

            # Read once up front: a refused `.metadata` raises UnsafeCheckpoint itself
            # (inside dcp.load it would surface wrapped in a CheckpointException).
            SafeFileSystemReader(path).read_metadata()
            with _single_process_is_intended():
                dcp.load(
                    {"train": state},
                    storage_reader=SafeFileSystemReader(path),
                    planner=SafeLoadPlanner(),
                )
        log.info("resumed from %s (step %d)", path, trainer.trained_step)
        self.loaded_extra = dict(state.extra)
        return state.extra

    def _prune(self) -> None:
        done = self.complete()
        for _, path in done[: max(0, len(done) - self.keep_last)]:
            remove_inside(path, self.root, ignore_errors=True)
