"""Procedural `reasoning-gym` datasets as tasks, scored by the dataset's own `score_answer`.

One dataset object per split, seeded from (run seed, task, split): item i is a pure
function of its index, so resume is exact and evaluation is held out. The item's metadata
travels on `Problem.metadata`, which `score_answer` needs. reasoning-gym is an optional
extra, imported when the task is built, with an error naming the extra when it is missing.
"""

from __future__ import annotations

import re
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.seeds import derive_seed, text_key
from tidal.orchestrator.task_config import ReasoningGymTaskConfig
from tidal.orchestrator.tasks.answer_checkers import extract_answer
from tidal.orchestrator.tasks.base import SPLIT_KEYS, Problem, Split, Task, Verdict

VIRTUAL_TRAIN_SIZE = 2**31 - 1
EXTRA = "pip install 'tidal-orchestrator[reasoning-gym]'"


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ConfigError(
            f"orchestrator task type 'reasoning_gym' needs the reasoning-gym extra: {EXTRA} ({exc})"
        ) from exc
    return reasoning_gym


class ReasoningGymTask(Task):
    name = "reasoning_gym"

    def __init__(self, config: ReasoningGymTaskConfig) -> None:
        self.config = config
        self.rg = _reasoning_gym()
        if config.dataset not in self.rg.factory.DATASETS:
            raise ConfigError(
                f"orchestrator task reasoning_gym: unknown dataset {config.dataset!r}; "
                f"registered: {', '.join(sorted(self.rg.factory.DATASETS))}"
            )
        try:
            self.extract = re.compile(config.extract) if config.extract else None
        except re.error as exc:
            raise ConfigError(f"orchestrator task {config.dataset}: extract: {exc}") from exc
        if self.extract is not None and self.extract.groups != 1:
            raise ConfigError(f"orchestrator task {config.dataset}: extract needs one group")
        self.name = config.dataset
        self.bind(name=self.name, seed=0)

    def _create(self, split: Split, size: int) -> Any:
        seed = derive_seed(self.seed, text_key(self.name), SPLIT_KEYS[split])
        try:
            return self.rg.create_dataset(
                self.config.dataset, seed=seed, size=size, **self.config.options
            )
        except (TypeError, ValueError, AssertionError) as exc:
            raise ConfigError(
                f"orchestrator task reasoning_gym {self.config.dataset!r}: options "
                f"{self.config.options}: {exc}"
            ) from exc

    def bind(self, *, name: str, seed: int) -> None:
        super().bind(name=name, seed=seed)
        # train now (bad options fail at start; verifier threads only read it), eval on
        # first use
        self._datasets: dict[str, Any] = {"train": self._create("train", VIRTUAL_TRAIN_SIZE)}

    def _dataset(self, split: Split) -> Any:
        if split not in self._datasets:
            self._datasets[split] = self._create(split, self.config.eval_size)
        return self._datasets[split]

    def size(self, split: Split = "train") -> int | None:
        return None if split == "train" else self.config.eval_size

    def problem(self, index: int, *, split: Split = "train") -> Problem:
        if split == "eval" and not 0 <= index < self.config.eval_size:
            raise IndexError(f"eval problem {index} of {self.config.eval_size}")
        entry = self._dataset(split)[index]
        question, answer = str(entry["question"]), str(entry["answer"])
        return Problem(
            prompt=question,
            reference=answer,
            answer=answer,
            task=self.name,
            uid=f"{self.name}/{split}/{index}",
            messages=({"role": "user", "content": question},),
            metadata=dict(entry.get("metadata", {})),
        )

    def verify(self, problem: Problem, completion: str) -> Verdict:
        extracted = extract_answer(completion, self.extract)
        flags = {} if self.extract is None else {"extracted": float(extracted is not None)}
        if extracted is None:
            return Verdict(0.0, {"score": 0.0, "correct": 0.0, **flags})
        entry = {"question": problem.prompt, "answer": problem.answer, "metadata": problem.metadata}
        score = float(self._dataset("train").score_answer(extracted.strip(), entry))
        return Verdict(score, {"score": score, "correct": float(score >= 1.0), **flags})

    @property
    def max_completion_chars(self) -> int:
        return self.config.max_answer_chars
