"""The step journal: every RL step's batch on disk before it trains, so a crashed trainer
replays what its last checkpoint lacks instead of losing it.

Why (issue 19): making every step durable by checkpointing it writes the weights and both
AdamW moments each step, ~400 MB at 33.6M parameters, and version n could be published
only after step n's checkpoint, so that write sat between every trained step and the
generation waiting for its version (docs/benchmarks/rl_step.md). A step is determined by
the state before it and its batch: the batch (a few KB to MB) is what must be durable.
This is a database's write-ahead log: full checkpoints every `trainer.ckpt.interval`
steps, the journal in between.

Decisions:
- An entry is written, fsynced and renamed into place before its step's update runs,
  under the runner's step lock, so every step that may have changed the weights, every
  answered step and every published version is in the newest checkpoint or the journal.
  A step that fails (an error, or a SIGTERM abandoning it before its update) has its
  entry removed, since nothing of it was committed.
- Layout: `<checkpoint dir>/journal/step_XXXXXXXX/state.<sha256>.safetensors`, the
  checkpoint's own file format (tidal.trainer.checkpoint_files: one file named after its
  sha256, no pickle), holding the micro-batches' tensors, the loss kind and the payload
  fingerprint. The entry is written in a hidden temp folder and renamed (commit_dir), so
  a crash mid-write leaves nothing that replay would read.
- Replay (`--resume`): from the newest checkpoint's step (or from the freshly built model
  when the journal starts at step 1, a run killed before its first checkpoint), each
  entry after it is trained again in order, through the same `train_step`. On the same
  machine and thread count that is bitwise the step that ran before (the resumed-run
  test of checkpoint.py holds that property for the same code path); elsewhere it is
  equal up to floating-point rounding. Replay stops at the first gap.
- Pruning: entries at or below the newest complete checkpoint are deleted when the next
  entry is written; the checkpoint covers them.
- One trainer process only: the runner journals when it saves its own checkpoints
  (a multi-rank job's saves are collectives and keep checkpoint-per-interval semantics).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from tidal.batch.tensors import MicroBatchData
from tidal.common.files.durable import commit_dir
from tidal.common.files.safe_remove import remove_inside
from tidal.trainer import checkpoint_files
from tidal.trainer.checkpoint import NAME, step_folders
from tidal.trainer.served_trainer import LossKind

log = logging.getLogger(__name__)

FOLDER = "journal"
TMP_PREFIX = ".tmp-"
_FIELDS = tuple(f.name for f in fields(MicroBatchData))


@dataclass(frozen=True)
class JournalEntry:
    step: int
    batches: list[MicroBatchData]
    kind: LossKind
    payload_sha256: bytes


def journal_dir(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / FOLDER


def first_journaled_step(checkpoint_dir: Path) -> int | None:
    """The lowest complete entry's step under `checkpoint_dir`, or None."""
    entries = StepJournal(checkpoint_dir).entries()
    return entries[0][0] if entries else None


class StepJournal:
    def __init__(self, checkpoint_dir: Path) -> None:
        self.root = journal_dir(checkpoint_dir)

    def entries(self) -> list[tuple[int, Path]]:
        """(step, folder) of every complete entry, oldest first."""
        return step_folders(self.root, checkpoint_files.is_complete)

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
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step:08d}"
        if final.exists():  # a step that ran before a crash, now trained again
            remove_inside(final, self.root)
        tmp = self.root / f"{TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        state = {
            "step": step,
            "kind": kind,
            "payload_sha256": payload_sha256.hex(),
            "batches": [{name: getattr(b, name) for name in _FIELDS} for b in batches],
        }
        checkpoint_files.write_state(tmp, state)
        commit_dir(tmp, final)
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
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            match = NAME.match(path.name)
            torn = path.name.startswith(TMP_PREFIX)
            if torn or (match and int(match.group(1)) <= covered_up_to):
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
    state = checkpoint_files.read_state(path)
    batches = [MicroBatchData(**{name: b[name] for name in _FIELDS}) for b in state["batches"]]
    return JournalEntry(
        step=int(state["step"]),
        batches=batches,
        kind=state["kind"],
        payload_sha256=bytes.fromhex(state["payload_sha256"]),
    )
