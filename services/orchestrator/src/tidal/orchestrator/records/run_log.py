"""The run log: one JSON line per step in `<run dir>/metrics.jsonl`, and TensorBoard scalars.

JSON lines are appended as steps finish, survive a crash up to the last complete step and
load with pandas or jq (non-finite floats become null). `extra` holds the open-ended fields
and `train` the trainer's, flattened with `/`. Other consumers (Prometheus, W&B) are sinks
called after each line is written; a failing sink never fails the run. tensorboardX is
imported with torch hidden: the orchestrator never imports torch.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidal.common.files.durable import space_for
from tidal.common.files.step_jsonl import line_step

log = logging.getLogger(__name__)
RUN_LOG_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def import_summary_writer() -> Any:
    """tensorboardX's SummaryWriter, imported with torch hidden (None if not installed).

    tensorboardX imports torch when it can (only to accept torch tensors); the
    orchestrator must never import torch, so `import torch` is made to fail meanwhile.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter


@dataclass
class StepRecord:
    step: int
    phase: str
    reward_mean: float | None
    reward_std: float | None
    policy_version: int
    """Oldest policy version behind this step's rollouts (warm-up: the version trained)."""
    policy_version_max: int
    staleness_mean: float | None
    samples: int
    """Samples trained on (after the staleness filter)."""
    dropped_stale: int
    completion_len_mean: float | None
    exact_fraction: float | None
    """Fraction of completions with reward 1.0 (the pass rate)."""
    generated_tokens: int
    trained_tokens: int
    micro_batches: int
    generate_seconds: float
    train_seconds: float
    seconds: float
    """Wall time since the previous step finished (the pipeline's period)."""
    tokens_per_s: float
    """(generated + trained tokens) / seconds."""
    trace_id: str
    train: dict[str, float] = field(default_factory=dict)
    """Metrics returned by the trainer, written with a `train/` prefix."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Open-ended metrics (already named with their prefix, e.g. `task/reversal/reward`)."""

    @classmethod
    def lost(cls, step: int) -> StepRecord:
        """The line of a step the trainer trained whose answer the orchestrator never got
        (it or the trainer died in between; found on `--resume`): every step keeps one
        line, with `resume/metrics_lost` = 1 and no measurements."""
        return cls(step, "lost", None, None, step, step, None, 0, 0, None, None, 0, 0, 0,
                   0.0, 0.0, 0.0, 0.0, "", extra={"resume/metrics_lost": 1})  # fmt: skip

    def flat(self) -> dict[str, Any]:
        data: dict[str, Any] = asdict(self)
        train = data.pop("train")
        extra = data.pop("extra")
        data.update(sorted(extra.items()))
        data.update({f"train/{k}": v for k, v in sorted(train.items())})
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in data.items()
        }

    def to_json(self) -> str:
        return json.dumps(self.flat())


class RunLog:
    """Appends step records to a JSONL file (and TensorBoard), keeps them for the report."""

    def __init__(self, path: Path, *, tensorboard: bool = True) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[StepRecord] = []
        self._checked_tail = False
        self._writer: Any = None
        self.sinks: list[Callable[[StepRecord], None]] = []
        """Called with every appended step, after it is written (Prometheus, W&B)."""
        if tensorboard:
            writer_class = import_summary_writer()
            if writer_class is None:
                log.info("tensorboardX is not installed; no TensorBoard events")
            else:
                self._writer = writer_class(str(path.parent / TENSORBOARD_DIR))

    @property
    def writes_tensorboard(self) -> bool:
        """Whether TensorBoard events are written beside the JSONL file."""
        return self._writer is not None

    def append(self, record: StepRecord) -> None:
        self.records.append(record)
        if not self._checked_tail:  # a line torn by a crash must not swallow this one
            self._checked_tail = True
            if self.path.is_file() and self.path.stat().st_size:
                with self.path.open("rb+") as f:
                    f.seek(-1, 2)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
        line = (record.to_json() + "\n").encode()
        with space_for(self.path, len(line)), self.path.open("ab") as f:
            f.write(line)
        if self._writer is not None:
            with space_for(self.path.parent / TENSORBOARD_DIR, None):
                for name, value in record.flat().items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        self._writer.add_scalar(name, value, record.step)
                self._writer.flush()
        for sink in self.sinks:
            try:
                sink(record)
            except Exception:
                log.exception("step %d: a run-log sink failed", record.step)

    def logged_steps(self) -> set[int]:
        """Steps that already have a line in the file (a torn last line is ignored)."""
        return logged_steps(self.path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def run_log_steps(path: Path) -> list[int]:
    """The step of every line of a run log (metrics.jsonl), in file order (repeats kept,
    so a caller can check one line per step); a torn or unreadable line is skipped."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [step for step in map(line_step, lines) if step is not None]


def run_log_records(path: Path) -> list[dict[str, Any]]:
    """Every line of a run log (metrics.jsonl) as its record, in file order; a torn or
    unreadable line is skipped, as `run_log_steps` skips it."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def logged_steps(path: Path) -> set[int]:
    """The steps that have a line in a run log (metrics.jsonl)."""
    return set(run_log_steps(path))
