"""Task configs: a discriminated union on `type`, one class per built-in task plus plug-ins.

Decisions:
- Every task config carries `weight` (its share of a mixture) and `name` (the label used
  in metrics; defaults to the type), so a mixture is simply a list of task configs.
- A plug-in task is named by import path (`type = "import"`, `path = "pkg.mod:Class"`)
  with free-form `options` passed to its constructor. The path is resolved when the
  orchestrator starts, so a typo fails before any step (see `tasks/registry.py`).
- Held-out evaluation data comes from the same task: generated tasks draw it from a
  separate seed stream, file datasets hold back `eval_fraction` of their lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tidal.common.config import BaseConfig


class TaskCommon(BaseConfig):
    weight: float = Field(default=1.0, gt=0)
    """Share of this task in a mixture (normalized over all tasks)."""
    name: str = ""
    """Label in metrics; empty means the task's type."""


class ReversalTaskConfig(TaskCommon):
    """The built-in verifiable task: reverse a random string ("abc>" → "cba")."""

    type: Literal["reversal"] = "reversal"
    """Task kind: reversal | arithmetic | countdown | dataset | import."""
    alphabet: str = Field(default="abcd", min_length=1)
    """Characters the strings are drawn from (ASCII, no '>')."""
    min_len: int = Field(default=1, ge=1)
    """Shortest string to reverse."""
    max_len: int = Field(default=3, ge=1)
    """Longest string to reverse."""
    turns: int = Field(default=1, ge=1, le=8)
    """Strings per episode: with turns > 1 the environment answers each reversal with
    the next string ("\nabd>"), and the reward is the mean over the turns."""

    @model_validator(mode="after")
    def _check(self) -> ReversalTaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len {self.min_len} is larger than max_len {self.max_len}")
        if ">" in self.alphabet or not self.alphabet.isascii():
            raise ValueError(f"alphabet {self.alphabet!r} must be ASCII and must not contain '>'")
        return self


class ArithmeticTaskConfig(TaskCommon):
    """Integer arithmetic: "12+7=" → "19", scored by the numeric verifier."""

    type: Literal["arithmetic"] = "arithmetic"
    """Task kind."""
    max_operand: int = Field(default=20, ge=1)
    """Operands are drawn from 0..max_operand."""
    operators: str = Field(default="+-", pattern=r"^[+\-*]+$")
    """Operators to draw from (any of "+-*")."""


class CountdownTaskConfig(TaskCommon):
    """Reach a target with given numbers: "3 5 7=22>" → "3*5+7" (each number at most once)."""

    type: Literal["countdown"] = "countdown"
    """Task kind."""
    num_numbers: int = Field(default=3, ge=2, le=6)
    """How many numbers a problem offers."""
    max_number: int = Field(default=9, ge=1)
    """Numbers are drawn from 1..max_number."""


class DatasetTaskConfig(TaskCommon):
    """Prompts and answers from a JSONL or parquet file of `{prompt, answer}` records."""

    type: Literal["dataset"] = "dataset"
    """Task kind."""
    path: Path
    """`.jsonl` (one JSON object per line) or `.parquet` (needs pyarrow) file."""
    verifier: Literal["exact", "numeric", "regex"] = "exact"
    """exact: stripped strings equal; numeric: equal as numbers (commas, spaces, trailing
    zeros ignored); regex: the record's answer is a pattern the completion must fullmatch."""
    extract: str | None = None
    """Optional regex with one group pulling the answer out of the completion first."""
    eval_fraction: float = Field(default=0.1, ge=0, lt=1)
    """Fraction of records held out for evaluation (chosen by the run seed)."""
    max_answer_chars: int = Field(default=32, gt=0)
    """Bound on completion length (characters) used when sampling.max_tokens is unset."""


class ImportTaskConfig(TaskCommon):
    """A plug-in task class named by import path (see docs/tasks.md)."""

    type: Literal["import"] = "import"
    """Task kind."""
    path: str = Field(pattern=r"^[\w.]+:[\w]+$")
    """"package.module:ClassName" of a `tidal.orchestrator.tasks.Task` subclass."""
    options: dict[str, Any] = {}
    """Keyword arguments for the class's constructor."""


TaskConfig = Annotated[
    ReversalTaskConfig
    | ArithmeticTaskConfig
    | CountdownTaskConfig
    | DatasetTaskConfig
    | ImportTaskConfig,
    Field(discriminator="type"),
]
