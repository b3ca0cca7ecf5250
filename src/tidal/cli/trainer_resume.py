"""Whether a trainer restarted with `--resume` can continue the run, read from disk.

A restarted trainer reaches the newest complete checkpoint's step (0: its initial weights)
and then the journaled steps after it, replayed; every version weightsync published is a
trained step, so the restart loses a step exactly when a published version is newer than
that. Read without torch (the launcher never imports it) from the layouts of
tidal.trainer.persistence (`step_XXXXXXXX` folders) and tidal.weights.folder (`v<N>`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tidal.weights.manifest import MANIFEST_FILE

STEP_FOLDER = re.compile(r"^step_(\d{8})$")
VERSION_FOLDER = re.compile(r"^v(\d+)$")
JOURNAL = "journal"


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: int
    """The newest complete checkpoint's step; 0 without one."""
    reached: int
    """The step a resumed trainer reaches: `checkpoint`, then the journal after it."""
    published: int | None
    """The newest version on disk; None before version 0."""

    def refusal(self, ckpt_dir: Path, weights_dir: Path) -> str | None:
        """Why a resumed trainer would lose a trained step (None: it loses none)."""
        if self.published is None or self.published <= self.reached:
            return None
        held = f"step {self.checkpoint}" if self.checkpoint else "no checkpoint"
        return (
            f"version {self.published} is published in {weights_dir}, but {ckpt_dir} holds "
            f"{held} and the step journal after it reaches step {self.reached}, so steps "
            f"{self.reached + 1}..{self.published} would be lost (the run checkpoints every "
            "trainer.ckpt.interval steps, 0 = never, and journals the steps between only "
            "with trainer.ckpt.journal on)"
        )


def _complete(folder: Path) -> bool:
    """A one-process state file, or a DCP checkpoint's metadata (written last)."""
    return (folder / ".metadata").is_file() or any(folder.glob("state.*.safetensors"))


def _steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    found = (STEP_FOLDER.match(p.name) for p in root.iterdir() if _complete(p))
    return sorted(int(m.group(1)) for m in found if m)


def resume_point(ckpt_dir: Path, weights_dir: Path) -> ResumePoint:
    checkpoint = max(_steps(ckpt_dir), default=0)
    reached = checkpoint
    for step in _steps(ckpt_dir / JOURNAL):
        if step == reached + 1:  # replay stops at the first gap
            reached = step
    versions = [
        int(m.group(1))
        for p in (weights_dir.iterdir() if weights_dir.is_dir() else ())
        if (m := VERSION_FOLDER.match(p.name)) and (p / MANIFEST_FILE).is_file()
    ]
    return ResumePoint(checkpoint, reached, max(versions, default=None))
