"""String reversal: "abc>" → "cba". Verifiable, tiny, and learnable by a 2-layer model.

Partial credit (matching positions over the longer length, on by default) gives GRPO
groups reward variance early, when exact answers are rare; without it the reward is 1 for
the exact reversal and 0 otherwise. With `turns > 1` the environment answers each
reversal with the next string, and the reward is the mean over turns.
"""

from __future__ import annotations

import random

from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks.base import GeneratedTask, Problem

SEPARATOR = ">"
TURN_PREFIX = "\n"


def reversal_reward(prediction: str, target: str) -> float:
    """Positional match fraction over max(len(prediction), len(target)); exact = 1.0."""
    if prediction == target:
        return 1.0
    longest = max(len(prediction), len(target))
    matches = sum(p == t for p, t in zip(prediction, target, strict=False))
    return matches / longest


class ReversalTask(GeneratedTask):
    name = "reversal"

    def __init__(self, config: ReversalTaskConfig) -> None:
        self.config = config

    def _string(self, rng: random.Random) -> str:
        length = rng.randint(self.config.min_len, self.config.max_len)
        return "".join(rng.choice(self.config.alphabet) for _ in range(length))

    def sample(self, rng: random.Random) -> Problem:
        text = self._string(rng)
        followups = []
        for _ in range(self.config.turns - 1):
            more = self._string(rng)
            followups.append((TURN_PREFIX + more + SEPARATOR, more[::-1]))
        return Problem(prompt=text + SEPARATOR, reference=text[::-1], followups=tuple(followups))

    def verify(self, problem: Problem, completion: str) -> float:
        if not self.config.partial_credit:
            return float(completion == problem.reference)
        return reversal_reward(completion, problem.reference)

    @property
    def max_completion_chars(self) -> int:
        return self.config.max_len
