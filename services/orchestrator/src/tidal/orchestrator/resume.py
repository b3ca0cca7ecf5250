"""The orchestrator's resumable progress: `<run dir>/progress.json`, replaced atomically.

Decisions:
- Written right before Train(n) is sent, with the task-mixture state both before and
  after step n drew its prompts. On resume the trainer's last step T decides which one
  applies: T = n means step n was trained (continue at n+1 from the `after` state);
  T = n-1 means Train(n) never arrived (redo step n from the `before` state, drawing the
  same prompts again). Anything else is an error naming both steps. So a kill at any
  point neither repeats nor skips a prompt.
- Pending samples policy: rollouts generated ahead for steps > n are discarded on a
  restart and regenerated from the saved cursors (same prompts, the policy of the time).
- Atomic replace: write a temp file in the same folder, fsync it, `os.replace` it over the
  old file, fsync the folder. A crash leaves either the old or the new file, never half.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidal.common.durable import write_atomic
from tidal.common.errors import ConfigError
from tidal.orchestrator.metrics import logged_steps

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


def resume_point(saved: SavedProgress, trainer_step: int) -> tuple[int, dict[str, Any]]:
    """(first step to run, mixture state to start it from) given the trainer's last step."""
    if trainer_step == saved.step:
        return saved.step + 1, saved.mixture_after
    if trainer_step == saved.step - 1:
        return saved.step, saved.mixture_before
    raise ConfigError(
        f"cannot resume: progress.json was written for step {saved.step} but the trainer's "
        f"last step is {trainer_step} (expected {saved.step} or {saved.step - 1})"
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
    with metrics_path.open("a") as f:
        f.write(json.dumps({**saved.pending_metrics, "recovered": True}) + "\n")
    return True


def cut_torn_tail(path: Path) -> None:
    """Drop a last line without its newline (a write cut short by a kill)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
