"""The curriculum's settings: when a completion counts as solved, which problems are
skipped and for how long, and how tasks are weighted. Everything is off by default."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig


class CurriculumConfig(BaseConfig):
    """Which problems a run trains on, from their online pass rates (docs/training.md,
    "Curricula"). A completion passes when its reward reaches `pass_threshold`; pass rates
    are tracked per task, and when skipping is on per problem for tasks with a finite
    training set (an unbounded generated task never repeats a problem). Everything is off
    by default: the mixture then draws by the tasks' fixed weights, problem after problem."""

    pass_threshold: float = Field(default=1.0, gt=0, le=1)
    """Reward at or above which a completion counts as solved."""
    skip_above: float | None = Field(default=None, gt=0, le=1)
    """Skip problems whose pass rate is at least this (1.0: the ones always solved);
    unset skips none for being easy."""
    skip_below: float | None = Field(default=None, ge=0, lt=1)
    """Skip problems whose pass rate is at most this (0.0: the ones never solved); unset
    skips none for being hard."""
    min_samples: int = Field(default=4, ge=1)
    """Completions of a problem seen before its pass rate may make it skipped; its pass
    rate is that of its latest visits (counts restart once this many were reached)."""
    readmit_after: int = Field(default=20, ge=1)
    """Steps after which a skipped problem is drawn again, its record cleared so its new
    completions decide anew."""
    task_weighting: Literal["fixed", "learning_progress", "signal"] = "fixed"
    """fixed: tasks drawn by their `weight`. learning_progress: tasks drawn in proportion
    to how fast their mean reward changes (|fast EMA − slow EMA|; the pass rate, for a
    0/1 reward). signal: tasks drawn in proportion to the recent share of their groups
    whose rewards differ (EMA at `fast_rate`), the groups whose advantages are not all
    zero. Either is mixed with the fixed weights by `explore`; a task whose groups are
    all solved or all failed gets only its explore share."""
    explore: float = Field(default=0.2, ge=0, le=1)
    """learning_progress, signal: share of draws by the fixed weights (so no task is
    starved)."""
    fast_rate: float = Field(default=0.1, gt=0, le=1)
    """Update rate, per observed group, of the fast reward EMA, of the task's reported
    pass rate and of its signal share."""
    slow_rate: float = Field(default=0.02, gt=0, le=1)
    """learning_progress: update rate of the slow reward EMA, per observed group."""

    @model_validator(mode="after")
    def _check(self) -> CurriculumConfig:
        low, high = self.skip_below, self.skip_above
        if low is not None and high is not None and low >= high:
            raise ValueError(
                f"orchestrator.curriculum.skip_below ({low}) must be below "
                f"orchestrator.curriculum.skip_above ({high}): raise skip_above or lower "
                "skip_below, or unset one of them"
            )
        if self.task_weighting == "learning_progress" and self.slow_rate >= self.fast_rate:
            raise ValueError(
                f"orchestrator.curriculum.slow_rate ({self.slow_rate}) must be below "
                f"orchestrator.curriculum.fast_rate ({self.fast_rate}): learning progress is "
                "the gap between a fast and a slow average"
            )
        return self

    @property
    def skips_problems(self) -> bool:
        return self.skip_above is not None or self.skip_below is not None
