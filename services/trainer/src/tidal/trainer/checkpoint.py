"""Checkpoints of the full training state with torch.distributed.checkpoint (DCP).

Decisions:
- DCP, not `torch.save`: every rank writes its own shards in parallel and loading
  reshards, so the same code serves one CPU process and an FSDP job (no process group
  needed single-process). Model and optimizer go through DCP's `get_state_dict` /
  `set_state_dict`, which know about FSDP/DTensor parameters.
- What is saved: model, optimizer, LR scheduler, torch RNG state(s), the step, and a
  small `extra` dict the caller owns (the SFT loop's data position). Resuming from it
  continues bitwise-identically to never having stopped (CPU, fp32). The KL reference
  model is not saved: it is the initial weights, rebuilt from the same config and seed.
- One process writes its own format instead (`checkpoint_files.py`: safetensors + JSON +
  a sha256 manifest): ~5x cheaper than DCP on the default model, cheap enough to save
  every step by default, and loadable without unpickling anything. A multi-rank job
  writes DCP; DCP folders are loaded through `safe_dcp.py` (allowlisted unpickling of
  `.metadata`, `weights_only` for every other item), so no checkpoint load runs
  pickled code. A DCP checkpoint loads into one process too (DCP reshards); a
  one-process checkpoint does not load into a multi-rank job (an error says so).
- Atomic: a checkpoint is written into a hidden `.tmp-step_XXXXXXXX-<nonce>` folder and
  renamed to `step_XXXXXXXX` only after it is complete (DCP's `.metadata` is written
  last; the one-process format is one file) and fsynced. A crash mid-save leaves
  only a hidden temp folder, which `latest()` never returns and the next save removes.
  A folder counts as a checkpoint only if its name matches and it holds `.metadata` or
  a `state.<sha256>.safetensors` file.
- Retention: after a new checkpoint is complete, all but the newest `keep_last` are
  deleted, so there is always at least one complete checkpoint on disk.
- Multi-rank: all ranks save into the same temp folder; rank 0 renames and prunes after
  a barrier. Single process: the barrier is skipped.
- What is checkpointed is a `TrainingState` (model, optimizer, scheduler, step), not the
  `Trainer` class: the `Trainer` and rank 0's `LeaderTrainer` both are one, so the
  leader's checkpoint manager saves what it is given without unwrapping it, and this
  module does not import the training step.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from tidal.common.files.durable import fsync_path, fsync_tree
from tidal.common.files.safe_remove import remove_inside
from tidal.trainer import checkpoint_files

log = logging.getLogger(__name__)

NAME = re.compile(r"^step_(\d{8})$")
TMP_PREFIX = ".tmp-"


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
    """What a checkpoint holds of a trainer (the `Trainer`, or rank 0's `LeaderTrainer`)."""

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler: ...

    trained_step: int  # the last step whose optimizer step ran; set on load


DCP_MODULE = "torch.distributed.checkpoint.state_dict"
"""What `import_dcp_in_background` imports: DCP and, through it, DTensor and sympy."""


def import_dcp_in_background() -> threading.Thread:
    """Import DCP on a daemon thread, so the first checkpoint finds it loaded.

    DCP is imported where it is used, not at module top: it pulls in DTensor and sympy,
    ~0.7 s of CPU that sat on the trainer's start-up path before it served. The trainer
    starts this thread once it serves (service.py), while it waits for its first batch;
    a save that comes first waits on Python's import lock for the same import."""
    thread = threading.Thread(
        target=importlib.import_module, args=(DCP_MODULE,), name="import-dcp", daemon=True
    )
    thread.start()
    return thread


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


def step_folders(root: Path, complete: Callable[[Path], bool]) -> list[tuple[int, Path]]:
    """(step, folder) of every `step_XXXXXXXX` folder under `root` that `complete` accepts,
    oldest first (checkpoints here, step journal entries in step_journal.py)."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = NAME.match(path.name)
        if match and path.is_dir() and complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def _is_complete(path: Path) -> bool:
    return (path / ".metadata").is_file() or checkpoint_files.is_complete(path)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    """Silence DCP's warning that no process group exists: one process is a supported setup."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


@dataclass(frozen=True)
class StateSnapshot:
    """A one-process trainer state taken at `step` (see `CheckpointManager.snapshot`)."""

    step: int
    state: dict[str, Any]


def _copy_containers(tree: Any) -> Any:
    """`tree` with every dict, list and tuple copied and the tensors shared: the live
    tensors are read once, when the snapshot is written; the rest may change meanwhile
    (the next step sets the optimizer's `lr`)."""
    if isinstance(tree, dict):
        return {k: _copy_containers(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_copy_containers(v) for v in tree)
    return tree


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
        return step_folders(self.root, _is_complete)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        done = self.complete()
        return done[-1][1] if done else None

    def snapshot(
        self, trainer: TrainingState, *, extra: dict[str, int] | None = None
    ) -> StateSnapshot:
        """One process: the trainer's state at its current step, to be written later by
        `save_snapshot`. Everything but the tensors is copied now (step, scheduler, RNG,
        optimizer hyper-parameters); the tensors are the live ones, so the caller must not
        change weights or optimizer state until `save_snapshot` has returned."""
        if dist.is_initialized():
            raise RuntimeError("a snapshot is one process's; a multi-rank job saves with save()")
        state = _copy_containers(TrainState(trainer, extra).state_dict())
        return StateSnapshot(step=trainer.trained_step, state=state)

    def save_snapshot(self, snapshot: StateSnapshot) -> Path:
        """Write a `snapshot` atomically (temp folder, fsync, rename); returns its folder."""
        final = self.root / f"step_{snapshot.step:08d}"
        tmp = self.root / f"{TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_temps()
        tmp.mkdir()
        checkpoint_files.write_state(tmp, {"train": snapshot.state})  # fsyncs its one file
        fsync_path(tmp)
        self._commit(tmp, final)
        log.info(
            "checkpoint of step %d saved", snapshot.step, extra={"fields": {"dir": str(final)}}
        )
        return final

    def _commit(self, tmp: Path, final: Path) -> None:
        """Rename a complete, fsynced temp folder into place, then prune old checkpoints."""
        if final.exists():  # an older save of the same step (e.g. re-run after resume)
            remove_inside(final, self.root)
        os.replace(tmp, final)
        fsync_path(self.root)
        self._prune()

    def save(self, trainer: TrainingState, *, extra: dict[str, int] | None = None) -> Path:
        """Write the trainer's state at its current step; returns the checkpoint folder."""
        if not dist.is_initialized():  # one process: our own format (module docstring)
            return self.save_snapshot(self.snapshot(trainer, extra=extra))
        step = trainer.trained_step
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f"{TMP_PREFIX}{final.name}-{_shared_nonce()}"
        if _is_rank0():
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_temps()
        _barrier()
        import torch.distributed.checkpoint as dcp

        dcp.save({"train": TrainState(trainer, extra)}, checkpoint_id=tmp)
        _barrier()
        if _is_rank0():
            fsync_tree(tmp)
            self._commit(tmp, final)
            log.info("checkpoint of step %d saved", step, extra={"fields": {"dir": str(final)}})
        _barrier()
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
        if checkpoint_files.is_complete(path):
            if dist.is_initialized() and dist.get_world_size() > 1:
                raise ValueError(
                    f"{path} was saved by one trainer process; a job of "
                    f"{dist.get_world_size()} ranks cannot load it (resume it with "
                    "trainer.world_size = 1)"
                )
            state.load_state_dict(checkpoint_files.read_state(path)["train"])
        else:
            import torch.distributed.checkpoint as dcp

            from tidal.trainer.safe_dcp import SafeFileSystemReader, SafeLoadPlanner

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

    def _temps(self) -> Iterator[Path]:
        return (p for p in self.root.iterdir() if p.name.startswith(TMP_PREFIX))

    def _remove_temps(self) -> None:
        for path in self._temps():
            log.warning("removing %s, left by an interrupted save", path)
            remove_inside(path, self.root, ignore_errors=True)

    def _prune(self) -> None:
        done = self.complete()
        for _, path in done[: max(0, len(done) - self.keep_last)]:
            remove_inside(path, self.root, ignore_errors=True)
