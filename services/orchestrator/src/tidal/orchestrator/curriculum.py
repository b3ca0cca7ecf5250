"""The curriculum: online pass rates per task and per problem, and what they change in
what the task mixture draws (problems skipped, task weights).

Its state is plain JSON (counts and averages keyed by task and problem) saved inside the
mixture's state, so progress.json holds it with the cursors and a resumed run draws what
an uninterrupted one would. Outcomes are observed as each round of a step is scored,
before the next draw (generations are chained), so their order is the step order.
Problems are tracked only for tasks with a finite training set: an unbounded generated
task never repeats a problem, and its records would only grow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tidal.orchestrator.curriculum_config import CurriculumConfig
from tidal.orchestrator.tasks.base import Problem, Task


@dataclass
class ProblemRecord:
    """A problem's latest completions: counts restart once `min_samples` were reached, so
    the pass rate is that of its latest visit(s), not of its whole history."""

    samples: int = 0
    passes: int = 0
    skipped_at: int | None = None
    """The step at which the problem was first skipped since it was last admitted."""
    task: str = ""
    """The task it belongs to."""


@dataclass
class TaskRecord:
    samples: int = 0
    passes: int = 0
    pass_rate: float | None = None
    """Recent pass rate: EMA (at `fast_rate`) of the per-group pass rate."""
    fast: float | None = None
    """Fast EMA of the task's per-group mean reward (None before its first group)."""
    slow: float | None = None
    """Slow EMA of the same."""
    signal: float | None = None
    """Recent share of its groups whose rewards differ: EMA (at `fast_rate`)."""

    @property
    def progress(self) -> float:
        """Learning progress: how fast the mean reward moves, in either direction."""
        if self.fast is None or self.slow is None:
            return 0.0
        return abs(self.fast - self.slow)


class Curriculum:
    def __init__(self, config: CurriculumConfig, tasks: Sequence[Task]) -> None:
        self.config = config
        self.tracked = {t.name for t in tasks if t.size("train") is not None}
        """Tasks whose problems are tracked one by one (a finite training set)."""
        self.problems: dict[str, ProblemRecord] = {}
        self.tasks = {t.name: TaskRecord() for t in tasks}
        self.skips = 0
        """Problems skipped so far (a problem skipped at several draws counts each time)."""
        self.blocked: dict[str, int] = {}
        """Finite tasks whose every problem is skipped → the step at which the first of them
        is due back; such a task is not drawn before it (drawing it could only skip)."""

    def observe(self, problem: Problem, rewards: Sequence[float]) -> None:
        """Count one group's completions of `problem` (its verifier rewards)."""
        if not rewards:
            return
        passes = sum(r >= self.config.pass_threshold for r in rewards)
        task = self.tasks[problem.task]
        task.samples += len(rewards)
        task.passes += passes
        rate, mean = passes / len(rewards), sum(rewards) / len(rewards)
        spread = float(max(rewards) > min(rewards))
        if task.pass_rate is None or task.fast is None or task.slow is None:
            task.pass_rate, task.fast, task.slow = rate, mean, mean
        else:
            task.pass_rate += self.config.fast_rate * (rate - task.pass_rate)
            task.fast += self.config.fast_rate * (mean - task.fast)
            task.slow += self.config.slow_rate * (mean - task.slow)
        if task.signal is None:  # its first group (or first since a state saved without it)
            task.signal = spread
        else:
            task.signal += self.config.fast_rate * (spread - task.signal)
        if problem.task in self.tracked and self.config.skips_problems:
            key = problem.key or problem.uid
            record = self.problems.setdefault(key, ProblemRecord(task=problem.task))
            if record.samples >= self.config.min_samples:  # judged on its latest visits only
                record.samples = record.passes = 0
            record.samples += len(rewards)
            record.passes += passes

    def admits(self, task: str, key: str, step: int) -> bool:
        """Whether the problem `key` of `task`, drawn for `step`, is trained on (False: skip
        it)."""
        if not self.config.skips_problems or task not in self.tracked:
            return True
        record = self.problems.get(key)
        if record is None or record.samples < self.config.min_samples:
            return True
        if record.skipped_at is not None and step - record.skipped_at >= self.config.readmit_after:
            del self.problems[key]  # re-admitted: its next completions decide anew
            return True
        if record.skipped_at is None:
            if not self._out_of_band(record.passes / record.samples):
                return True
            record.skipped_at = step
        self.skips += 1
        return False

    def drawable(self, names: Sequence[str], weights: Sequence[float], step: int) -> list[float]:
        """`weights` with those of the tasks blocked at `step` set to 0."""
        return [
            0.0 if self.blocked.get(name, step) > step else w
            for name, w in zip(names, weights, strict=True)
        ]

    def block(self, name: str, step: int) -> None:
        """Task `name` had every one of its problems skipped at `step`: leave it out of the
        draws until the earliest of them is due for re-admission."""
        skipped = [r.skipped_at for r in self.problems.values() if r.task == name]
        self.blocked[name] = min(s for s in skipped if s is not None) + self.config.readmit_after

    def _out_of_band(self, rate: float) -> bool:
        above, below = self.config.skip_above, self.config.skip_below
        return (above is not None and rate >= above) or (below is not None and rate <= below)

    def task_weights(self, names: Sequence[str], weights: Sequence[float]) -> list[float]:
        """The relative draw weight of each task: the fixed `weights`, or under
        learning_progress (signal) probabilities mixing those with each task's share of
        the learning progress (of the signal)."""
        if self.config.task_weighting == "fixed":
            return list(weights)
        scores = [self._score(self.tasks[name]) for name in names]
        if sum(scores) <= 0:
            return list(weights)  # nothing to go by yet (or any more): the fixed mixture
        fixed = [w / sum(weights) for w in weights]
        explore = self.config.explore
        return [
            (1 - explore) * score / sum(scores) + explore * f
            for score, f in zip(scores, fixed, strict=True)
        ]

    def _score(self, task: TaskRecord) -> float:
        """What a task is weighted by, beyond its explore share. Under signal, a task not
        yet seen counts as all signal, so each is tried before the weights settle."""
        if self.config.task_weighting == "learning_progress":
            return task.progress
        return 1.0 if task.signal is None else task.signal

    def metrics(self, names: Sequence[str], weights: Sequence[float]) -> dict[str, float]:
        """`curriculum/*`: each task's recent pass rate and draw probability, skips so far
        and problems skipped now."""
        out: dict[str, float] = {}
        drawn = self.task_weights(names, weights)
        for name, weight in zip(names, drawn, strict=True):
            task = self.tasks[name]
            if task.pass_rate is not None:
                out[f"curriculum/{name}/pass_rate"] = task.pass_rate
                out[f"curriculum/{name}/progress"] = task.progress
            if task.signal is not None:
                out[f"curriculum/{name}/signal"] = task.signal
            out[f"curriculum/{name}/weight"] = weight / sum(drawn)
        if self.config.skips_problems:
            out["curriculum/skips"] = float(self.skips)
            out["curriculum/skipped_now"] = float(
                sum(r.skipped_at is not None for r in self.problems.values())
            )
            out["curriculum/problems_tracked"] = float(len(self.problems))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "problems": {key: asdict(r) for key, r in self.problems.items()},
            "tasks": {name: asdict(r) for name, r in self.tasks.items()},
            "skips": self.skips,
            "blocked": dict(self.blocked),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.problems = {key: ProblemRecord(**r) for key, r in state["problems"].items()}
        self.tasks = {name: TaskRecord(**state["tasks"][name]) for name in self.tasks}
        self.skips = int(state["skips"])
        self.blocked = {name: int(step) for name, step in state.get("blocked", {}).items()}
