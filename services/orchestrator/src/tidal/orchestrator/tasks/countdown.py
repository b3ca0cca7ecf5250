"""Countdown: reach a target with given numbers, "3 5 7=22>" → "3*5+7".

Solvable by construction: the target is the value of a random left-to-right expression,
which is also the warm-start reference. The checker parses with `ast` and accepts only
integer literals, + - * / and parentheses, computes with exact `Fraction`s and lets each
given number be used at most once; sub-scores show what failed.
"""

from __future__ import annotations

import ast
import operator
import random
from collections import Counter
from fractions import Fraction

from tidal.orchestrator.task_config import CountdownTaskConfig
from tidal.orchestrator.tasks.base import GeneratedTask, Problem, Verdict

SEPARATOR = ">"
MAX_EXPRESSION_CHARS = 200
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class InvalidExpression(ValueError):
    pass


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise InvalidExpression("division by zero")
        return Fraction(_BINARY[type(node.op)](left, right))
    raise InvalidExpression(f"{type(node).__name__} is not allowed")


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Value of an arithmetic expression and the integer literals it uses."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise InvalidExpression(f"longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise InvalidExpression(str(exc)) from exc
    used: list[int] = []
    return _evaluate(tree.body, used), used


def check_countdown(expression: str, numbers: list[int], target: int) -> Verdict:
    try:
        value, used = evaluate_expression(expression)
    except InvalidExpression:
        return Verdict(0.0, {"valid_expression": 0.0, "uses_given_numbers": 0.0})
    allowed = not (Counter(used) - Counter(numbers))
    correct = allowed and value == target
    return Verdict(float(correct), {"valid_expression": 1.0, "uses_given_numbers": float(allowed)})


def parse_prompt(prompt: str) -> tuple[list[int], int]:
    numbers, _, target = prompt.removesuffix(SEPARATOR).partition("=")
    return [int(n) for n in numbers.split()], int(target)


class CountdownTask(GeneratedTask):
    name = "countdown"

    def __init__(self, config: CountdownTaskConfig) -> None:
        self.config = config

    def sample(self, rng: random.Random) -> Problem:
        numbers = [rng.randint(1, self.config.max_number) for _ in range(self.config.num_numbers)]
        expression = str(numbers[0])
        for n in numbers[1:]:
            expression += rng.choice("+-*") + str(n)
        target, _ = evaluate_expression(expression)
        shown = sorted(numbers)
        prompt = f"{' '.join(map(str, shown))}={int(target)}{SEPARATOR}"
        return Problem(prompt=prompt, reference=expression)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        numbers, target = parse_prompt(problem.prompt)
        return check_countdown(completion, numbers, target)

    @property
    def max_completion_chars(self) -> int:
        n = self.config.num_numbers
        return n * len(str(self.config.max_number)) + (n - 1) + 2
