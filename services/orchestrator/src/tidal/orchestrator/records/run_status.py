"""The run's progress: what GetProgress reports, updated by the loop as steps finish.

Plain dataclasses owned by the loop and read by the servicer in the same event loop, so
no locking is needed. `recent` is bounded so a long run's progress stays small.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

State = Literal["starting", "warmup", "rl", "done", "failed"]


@dataclass(frozen=True)
class StepSummary:
    step: int
    phase: str
    reward_mean: float | None
    """None for steps that generated nothing (warm-up)."""
    policy_version: int
    seconds: float


@dataclass
class ProgressState:
    total_steps: int
    recent_limit: int = 20
    step: int = 0
    """Last completed step (0 before any)."""
    policy_version: int = -1
    """Newest version seen published (-1 before any)."""
    state: State = "starting"
    recent: deque[StepSummary] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.recent = deque(self.recent, maxlen=self.recent_limit)

    def saw_version(self, version: int) -> None:
        self.policy_version = max(self.policy_version, version)

    def finish_step(self, summary: StepSummary) -> None:
        self.step = max(self.step, summary.step)
        self.recent.append(summary)
