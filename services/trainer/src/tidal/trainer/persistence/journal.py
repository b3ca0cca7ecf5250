"""The step journal: every RL step's batch on disk before its update runs, so a crashed
trainer replays what its newest checkpoint lacks instead of losing it.

A step is determined by the state before it and its batch, so the batch is what must be
durable between full checkpoints: a write-ahead log. Each entry is a step folder of one
state file (state_file.py: micro-batches, loss kind, payload fingerprint) under
`<checkpoint dir>/journal/`, fsynced and renamed into place. Replay reads the entries
after a step in order and stops at the first gap; entries a checkpoint covers are pruned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from tidal.batch.tensors import MicroBatchData
from tidal.common.files.safe_remove import remove_inside
from tidal.trainer.persistence import state_file

log = logging.getLogger(__name__)

FOLDER = "journal"
LossKind = Literal["pg", "sft"]
_FIELDS = tuple(f.name for f in fields(MicroBatchData))


@dataclass(frozen=True)
class JournalEntry:
    step: int
    batches: list[MicroBatchData]
    kind: LossKind
    payload_sha256: bytes


def journal_dir(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / FOLDER


class StepJournal:
    def __init__(self, checkpoint_dir: Path) -> None:
        self.root = journal_dir(checkpoint_dir)

    def entries(self) -> list[tuple[int, Path]]:
        """(step, folder) of every complete entry, oldest first."""
        return state_file.step_folders(self.root)

    def append(
        self,
        step: int,
        batches: list[MicroBatchData],
        kind: LossKind,
        payload_sha256: bytes,
        *,
        covered_up_to: int = 0,
    ) -> None:
        """Write step `step`'s entry durably; then delete the entries at or below
        `covered_up_to` (the newest complete checkpoint's step)."""
        state = {
            "step": step,
            "kind": kind,
            "payload_sha256": payload_sha256.hex(),
            "batches": [{name: getattr(b, name) for name in _FIELDS} for b in batches],
        }
        state_file.write_step_folder(self.root, step, state)
        self.prune(covered_up_to)

    def truncate(self, after: int) -> None:
        """Delete the entries of steps above `after`: on a fresh start (`after` 0, a reused
        checkpoint folder) and after a replay that stopped at a gap, so no stale entry is
        ever replayed into a later lineage."""
        for found, path in self.entries():
            if found > after:
                remove_inside(path, self.root, ignore_errors=True)

    def discard(self, step: int) -> None:
        """Remove step `step`'s entry: the step failed before committing anything."""
        path = self.root / f"step_{step:08d}"
        if path.exists():
            remove_inside(path, self.root, ignore_errors=True)

    def prune(self, covered_up_to: int) -> None:
        """Delete entries at or below `covered_up_to`, and temp folders of torn writes."""
        state_file.remove_temps(self.root)
        for found, path in state_file.step_folders(self.root, lambda _: True):
            if found <= covered_up_to:
                remove_inside(path, self.root, ignore_errors=True)

    def after(self, step: int) -> Iterator[JournalEntry]:
        """The entries for steps `step + 1`, `step + 2`, … in order, up to the first gap;
        each verified (sha256) and decoded."""
        expected = step + 1
        for found, path in self.entries():
            if found < expected:
                continue
            if found != expected:
                log.warning(
                    "step journal: step %d's entry is missing; entries from step %d on are "
                    "not replayed",
                    expected,
                    found,
                )
                return
            yield _read(path)
            expected += 1


def _read(path: Path) -> JournalEntry:
    state = state_file.read_state(path)
    batches = [
        MicroBatchData(**{name: b[name] for name in _FIELDS if name in b}) for b in state["batches"]
    ]
    return JournalEntry(
        step=int(state["step"]),
        batches=batches,
        kind=state["kind"],
        payload_sha256=bytes.fromhex(state["payload_sha256"]),
    )
