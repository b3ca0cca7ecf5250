"""String reversal: "abc>" → "cba". Verifiable, tiny, and learnable by a 2-layer model.

Decisions:
- Prompt is the string followed by '>', the separator the model learns to answer after;
  the reference answer is the reversed string (the EOS token is the orchestrator's job).
- Partial credit: the fraction of positions that match the target, divided by
  max(len(prediction), len(target)), so both missing and extra characters cost. An exact
  answer scores 1.0. Dense credit gives GRPO groups reward variance early in training,
  when exact answers are rare; a 0/1 reward would leave most groups with zero advantage.
- Multi-turn (`turns > 1`): the environment replies to each answer with the next
  string ("\nabd>"); the episode's reward is the mean over turns (Task.verify_turns).
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
        return reversal_reward(completion, problem.reference)

    @property
    def max_completion_chars(self) -> int:
        return self.config.max_len
