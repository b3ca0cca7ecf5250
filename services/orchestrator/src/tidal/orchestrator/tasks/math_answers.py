"""The math verifier: extract a final answer, compare it symbolically with `math-verify`.

The final answer is a GSM8K `####` marker's text, else a boxed answer, an "answer:" phrase
or the last expression; comparison is math-verify's, so 0.5 equals one half in LaTeX.
math-verify's signal-based timeouts are off (they work only in a main thread) and the
verifier pool's deadline applies; expressions that could evaluate forever (huge
exponents, factorials) are refused before comparison. docs/tasks.md has the rules.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

from tidal.orchestrator.tasks.base import Verdict

GSM8K_MARKER = "####"
MAX_EXPONENT = 1000
MAX_FACTORIAL = 1000
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


class _DropTimeoutDisabledWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def _math_verify() -> Any:
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutDisabledWarning) for f in logger.filters):
            logger.addFilter(_DropTimeoutDisabledWarning())
    return math_verify


def after_marker(text: str) -> str | None:
    """The text after the last GSM8K `####` marker, thousands commas removed; None without one."""
    if GSM8K_MARKER not in text:
        return None
    return _THOUSANDS.sub("", text.rsplit(GSM8K_MARKER, 1)[1].strip())


def _combinatorial() -> tuple[type, ...]:
    import sympy

    return (
        sympy.factorial,
        sympy.factorial2,
        sympy.subfactorial,
        sympy.binomial,
        sympy.gamma,
        sympy.RisingFactorial,
        sympy.FallingFactorial,
    )


def is_tame(expr: Any) -> bool:
    """False for what sympy may take forever to evaluate: a power with a nested or huge
    numeric exponent, or a factorial-like function (factorial, binomial, gamma, ...) of a
    large number."""
    import sympy

    if not isinstance(expr, sympy.Basic):
        return True
    combinatorial = _combinatorial()
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow):
            exponent = node.exp
            if exponent.has(sympy.Pow) or exponent.has(*combinatorial):
                return False
            if exponent.is_number and abs(exponent) > MAX_EXPONENT:
                return False
        if isinstance(node, combinatorial) and any(
            arg.is_number and abs(arg) > MAX_FACTORIAL for arg in node.args
        ):
            return False
    return True


class MathVerifier:
    """Scores a completion against a reference answer with math-verify (thread-safe)."""

    def __init__(self, *, format_weight: float = 0.0) -> None:
        self.format_weight = format_weight
        self.mv = _math_verify()
        self.configs = [
            self.mv.LatexExtractionConfig(boxed_match_priority=0),
            self.mv.ExprExtractionConfig(),
        ]
        self.parse_reference = lru_cache(maxsize=4096)(self._parse_reference)
        # the first call builds sympy's and the LaTeX parser's state (~0.5 s): pay it at
        # start, not against the first verifier deadline
        self.score("\\boxed{1}", "1")

    def _parse(self, text: str) -> list[Any]:
        return list(self.mv.parse(text, self.configs, parsing_timeout=None))

    def _parse_reference(self, reference: str) -> tuple[Any, ...]:
        text = after_marker(reference)
        if text is None:
            text = reference.strip()
        if "\\boxed" in text or "$" in text:
            return tuple(self._parse(text))
        return tuple(self._parse(f"\\boxed{{{text}}}") or self._parse(text))

    def extract(self, completion: str) -> list[Any]:
        """The parsed final answer of a completion (empty when none is found)."""
        marked = after_marker(completion)
        if marked:
            found = self._parse(marked)
            if found:
                return found
        return self._parse(completion)

    def score(self, completion: str, reference: str) -> Verdict:
        gold = list(self.parse_reference(reference))
        if not gold:  # a data problem, not the model's: counted and logged as an error
            raise ValueError(f"reference {reference[-80:]!r} has no answer math-verify can read")
        answer = self.extract(completion)
        correct = (
            bool(answer)
            and all(is_tame(x) for x in (*gold, *answer))
            and bool(self.mv.verify(gold, answer, timeout_seconds=None))
        )
        form, right = float(bool(answer)), float(correct)
        reward = (1.0 - self.format_weight) * right + self.format_weight * form
        return Verdict(reward, {"format": form, "answer": right})
