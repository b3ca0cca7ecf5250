"""The task mixture: which task each prompt comes from, and a cursor into every task.

The state is one cursor per task plus the mixture RNG's state, small and JSON-serializable:
saved after a step and loaded on resume, it makes the run draw exactly the prompts it
would have drawn next. The task of each prompt is drawn by weight and its problem taken
by cursor, so a file dataset is walked epoch by epoch without repeats within an epoch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.tasks.base import Problem, Task

MIXTURE_SEED_KEY = 7


class TaskMixture:
    def __init__(self, tasks: Sequence[Task], weights: Sequence[float], *, seed: int) -> None:
        if not tasks or len(tasks) != len(weights):
            raise ConfigError("orchestrator tasks: need at least one task, each with a weight")
        self.tasks = {t.name: t for t in tasks}
        self.names = [t.name for t in tasks]
        self.weights = list(weights)
        self.rng = random.Random(derive_seed(seed, MIXTURE_SEED_KEY))
        self.cursors = dict.fromkeys(self.names, 0)

    def draw(self, count: int) -> list[Problem]:
        """The next `count` training problems."""
        problems = []
        for name in self.rng.choices(self.names, weights=self.weights, k=count):
            problems.append(self.tasks[name].problem(self.cursors[name], split="train"))
            self.cursors[name] += 1
        return problems

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
        return {"cursors": dict(self.cursors), "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cursors = state["cursors"]
        if set(cursors) != set(self.names):
            raise ConfigError(
                f"saved progress has tasks {sorted(cursors)}, this run has {sorted(self.names)}"
            )
        self.cursors = {name: int(cursors[name]) for name in self.names}
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
