"""The task interface: sample problems with a seeded RNG, render prompts, verify answers.

Decisions:
- A task works on text, not tokens: the orchestrator tokenizes the prompt and the
  reference with the run's tokenizer, so a task never depends on one.
- Problems are sampled from an explicit `random.Random` the caller owns (seeded from the
  run seed and the step), so a step's prompts are reproducible and independent of how
  many steps ran before in this process.
- `verify` returns a reward in [0, 1]; partial credit is the task's choice. It sees the
  decoded completion with special tokens removed.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One prompt with what is needed to check an answer to it."""

    prompt: str
    """Prompt text (the tokenizer adds BOS)."""
    reference: str
    """A correct completion, without the end-of-sequence token (used for SFT warm start)."""


class Task(ABC):
    name: str

    @abstractmethod
    def sample(self, rng: random.Random) -> Problem:
        """Draw one problem."""

    @abstractmethod
    def verify(self, problem: Problem, completion: str) -> float:
        """Reward of `completion` (decoded, special tokens removed) in [0, 1]."""

    @property
    @abstractmethod
    def max_completion_chars(self) -> int:
        """Longest reference completion, in characters; bounds sampling's max_tokens."""

    def sample_many(self, rng: random.Random, count: int) -> list[Problem]:
        return [self.sample(rng) for _ in range(count)]
