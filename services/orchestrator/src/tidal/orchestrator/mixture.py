"""The task mixture: which task each prompt comes from, and a cursor into every task.

The state is one cursor per task, the mixture RNG's state and the curriculum's pass rates,
JSON-serializable: saved after a step and loaded on resume, it makes the run draw exactly
the prompts it would have drawn next. The task of each prompt is drawn by weight (fixed,
or the curriculum's) and its problem taken by cursor, so a file dataset is walked epoch by
epoch without repeats within an epoch; a problem the curriculum skips is passed over and
its place drawn again. One `random()` per candidate, so without skips the draws are those
of a plain weighted choice.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.curriculum import Curriculum
from tidal.orchestrator.curriculum_config import CurriculumConfig
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.tasks.base import Problem, Task

MIXTURE_SEED_KEY = 7


class TaskMixture:
    def __init__(
        self,
        tasks: Sequence[Task],
        weights: Sequence[float],
        *,
        seed: int,
        curriculum: CurriculumConfig | None = None,
    ) -> None:
        if not tasks or len(tasks) != len(weights):
            raise ConfigError("orchestrator tasks: need at least one task, each with a weight")
        self.tasks = {t.name: t for t in tasks}
        self.names = [t.name for t in tasks]
        self.weights = list(weights)
        self.rng = random.Random(derive_seed(seed, MIXTURE_SEED_KEY))
        self.cursors = dict.fromkeys(self.names, 0)
        self.curriculum = Curriculum(curriculum or CurriculumConfig(), tasks)
        self.sizes = {t.name: t.size("train") for t in tasks}

    def draw(self, count: int, *, step: int = 0) -> list[Problem]:
        """The next `count` training problems, for step `step`."""
        weights = self.curriculum.task_weights(self.names, self.weights)
        return [self._next(weights, step) for _ in range(count)]

    def _next(self, weights: list[float], step: int) -> Problem:
        """The next problem the curriculum admits: a task by weight, then its next problem,
        again while the curriculum skips it, so a skipped problem's place goes to whichever
        task the weights pick. A finite task whose whole set was skipped in one search is
        blocked (not drawn) until one of its problems is due back; when every task is
        blocked, the candidate the weights pick is taken (a step always gets its prompts)."""
        skipped: dict[str, set[str]] = {name: set() for name in self.names}
        while True:
            live = self.curriculum.drawable(self.names, weights, step)
            (name,) = self.rng.choices(self.names, live if any(live) else weights)
            task, index = self.tasks[name], self.cursors[name]
            self.cursors[name] += 1
            key = task.key(index, split="train")
            if not any(live) or self.curriculum.admits(name, key, step):
                return task.problem(index, split="train")
            skipped[name].add(key)  # only finite tasks skip
            if len(skipped[name]) >= (self.sizes[name] or 0):
                self.curriculum.block(name, step)

    def observe(self, problem: Problem, rewards: Sequence[float]) -> None:
        """A group's verifier rewards, for the curriculum's pass rates."""
        self.curriculum.observe(problem, rewards)

    def curriculum_metrics(self) -> dict[str, float]:
        return self.curriculum.metrics(self.names, self.weights)

    def eval_problems(self, name: str, count: int) -> list[Problem]:
        """The first `count` held-out problems of a task (fewer if its eval split is smaller)."""
        task = self.tasks[name]
        size = task.size("eval")
        return [task.problem(i, split="eval") for i in range(min(count, size or count))]

    @property
    def max_completion_chars(self) -> int:
        return max(t.max_completion_chars for t in self.tasks.values())

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "cursors": dict(self.cursors),
            "rng": [version, list(internal), gauss],
            "curriculum": self.curriculum.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cursors = state["cursors"]
        if set(cursors) != set(self.names):
            raise ConfigError(
                f"saved progress has tasks {sorted(cursors)}, this run has {sorted(self.names)}"
            )
        self.cursors = {name: int(cursors[name]) for name in self.names}
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        if "curriculum" in state:  # a file saved without one starts the curriculum afresh
            self.curriculum.load_state_dict(state["curriculum"])
