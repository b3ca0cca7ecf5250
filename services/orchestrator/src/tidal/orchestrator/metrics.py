"""Per-step run metrics: one JSON object per line in `<run dir>/metrics.jsonl`.

JSON lines because they are appended as steps finish, survive a crash up to the last
complete step, and load with one line of pandas or jq. Non-finite floats are written as
null (JSON has no NaN).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


@dataclass
class StepMetrics:
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
    """Fraction of completions with reward 1.0."""
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

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        train = data.pop("train")
        data.update({f"train/{k}": v for k, v in sorted(train.items())})
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in data.items()
        }
        return json.dumps(clean)


class MetricsLog:
    """Appends step metrics to a JSONL file and keeps them in memory for the summary."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[StepMetrics] = []

    def append(self, metrics: StepMetrics) -> None:
        self.records.append(metrics)
        with self.path.open("a") as f:
            f.write(metrics.to_json() + "\n")
