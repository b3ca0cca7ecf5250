"""Integer arithmetic: "12+7=" → "19", scored by the numeric verifier (0 or 1).

One binary operation per problem, the smallest arithmetic a tiny model learns; the operand
range and the operator set scale it up. Any formatting of the right value scores.
"""

from __future__ import annotations

import random

from tidal.orchestrator.task_config import ArithmeticTaskConfig
from tidal.orchestrator.tasks.answer_checkers import numeric_match, parse_number
from tidal.orchestrator.tasks.base import GeneratedTask, Problem, Verdict

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask(GeneratedTask):
    name = "arithmetic"

    def __init__(self, config: ArithmeticTaskConfig) -> None:
        self.config = config

    def sample(self, rng: random.Random) -> Problem:
        a = rng.randint(0, self.config.max_operand)
        b = rng.randint(0, self.config.max_operand)
        op = rng.choice(self.config.operators)
        return Problem(prompt=f"{a}{op}{b}=", reference=str(OPERATIONS[op](a, b)))

    def verify(self, problem: Problem, completion: str) -> Verdict:
        correct = numeric_match(completion, problem.reference)
        parsed = parse_number(completion) is not None
        return Verdict(float(correct), {"is_number": float(parsed)})

    @property
    def max_completion_chars(self) -> int:
        top = self.config.max_operand
        extremes = [
            OPERATIONS[op](a, b) for op in self.config.operators for a in (0, top) for b in (0, top)
        ]
        return max(len(str(v)) for v in extremes)
