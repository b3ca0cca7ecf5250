"""The orchestrator's resumable progress: `<run dir>/progress.json`, replaced atomically.

Written right before Train(n), with the mixture state before and after step n drew its
prompts and before step n-1 drew its own. On resume the trainer's last step T picks one:
T = n continues from `after`, n-1 redoes step n from `before`, n-2 redoes step n-1 from
`previous_before`, anything else is an error; so a kill never repeats or skips a prompt.
The file is replaced by temp file, fsync, rename and fsync of the folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidal.common.errors import ConfigError
from tidal.common.files.durable import space_for, write_atomic
from tidal.common.files.step_jsonl import cut_torn_tail, drop_lines_after
from tidal.orchestrator.records.run_log import logged_steps

PROGRESS_FILE = "progress.json"
FORMAT_VERSION = 1
PENDING_POLICY = "regenerate"


@dataclass
class SavedProgress:
    step: int
    """The step whose Train call was about to be sent when this was written."""
    mixture_before: dict[str, Any]
    mixture_after: dict[str, Any]
    seed: int
    tasks: list[str]
    pending_policy: str = PENDING_POLICY
    counters: dict[str, float] = field(default_factory=dict)
    """Run-level counters carried over a restart (e.g. samples dropped so far)."""
    pending_metrics: dict[str, Any] | None = None
    """Step `step`'s metrics line without the trainer's reply (see recover_metrics_line)."""
    version: int = FORMAT_VERSION
    previous_before: dict[str, Any] | None = None
    """The mixture state before step `step - 1` drew its prompts (None for a run's first
    step, or when a resume went back past what the previous file knew; a file written
    before this field existed loads with None)."""


def save_progress(path: Path, progress: SavedProgress) -> None:
    write_atomic(path, json.dumps(asdict(progress)))


def load_progress(path: Path) -> SavedProgress | None:
    """The saved progress, or None when there is none yet."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        progress = SavedProgress(**data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise ConfigError(f"{path}: not a progress file of this version: {exc}") from exc
    if progress.version != FORMAT_VERSION:
        raise ConfigError(f"{path}: progress format {progress.version}, expected {FORMAT_VERSION}")
    return progress


def previous_before(last: SavedProgress | None, step: int) -> dict[str, Any] | None:
    """The `previous_before` of step `step`'s progress, given the last progress saved (in
    this life, or the previous life's file on a resume): the state before step `step - 1`
    drew its prompts, when that is known."""
    if last is None:
        return None
    if last.step == step - 1:
        return last.mixture_before
    if last.step == step:  # the step is being redone after a resume: same predecessor
        return last.previous_before
    return None


def resume_point(saved: SavedProgress, trainer_step: int) -> tuple[int, dict[str, Any]]:
    """(first step to run, mixture state to start it from) given the trainer's last step."""
    if trainer_step == saved.step:
        return saved.step + 1, saved.mixture_after
    if trainer_step == saved.step - 1:
        return saved.step, saved.mixture_before
    if trainer_step == saved.step - 2 and saved.previous_before is not None:
        return saved.step - 1, saved.previous_before
    expected = [saved.step, saved.step - 1] + [saved.step - 2] * (saved.previous_before is not None)
    raise ConfigError(
        f"cannot resume: progress.json was written for step {saved.step} but the trainer's "
        f"last step is {trainer_step} (expected {' or '.join(map(str, expected))})"
    )


def recover_metrics_line(saved: SavedProgress, trainer_step: int, metrics_path: Path) -> bool:
    """If step `saved.step` was trained but its metrics line never written (the
    orchestrator died while Train was answered), write the line saved before Train, marked
    `recovered` (its `train/*` values are lost with the reply). Returns whether it did.
    A torn last line (died mid-write) is cut first, so every line stays one JSON object."""
    cut_torn_tail(metrics_path)
    if trainer_step != saved.step or saved.pending_metrics is None:
        return False
    if saved.step in logged_steps(metrics_path):
        return False
    line = json.dumps({**saved.pending_metrics, "recovered": True}) + "\n"
    with space_for(metrics_path, len(line)), metrics_path.open("a") as f:
        f.write(line)
    return True


def drop_lost_lines(metrics_path: Path, trainer_step: int) -> list[int]:
    """Remove the metrics lines of steps after `trainer_step`; returns their steps.

    Without its step journal the trainer answers Train(n) once step n is trained and
    makes it durable just after (tidal.trainer.step_persistence), so a trainer killed
    in between resumes at n-1 although step n was logged. Step n is then trained again,
    from the same prompts (`resume_point`), and its first line belongs to a lineage the
    crash ended: it goes, so the file keeps one line per step of the run that survives.
    The file is replaced atomically (a crash leaves the old or the new one)."""
    return drop_lines_after(metrics_path, trainer_step)
