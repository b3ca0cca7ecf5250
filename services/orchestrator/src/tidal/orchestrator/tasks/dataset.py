"""A task from a file of `{prompt, answer}` records (JSONL or parquet) and a verifier.

Decisions:
- Bad records never stop a run: a line that is not a JSON object with a string `prompt`
  and a string or number `answer` (or, for the regex verifier, an answer that is not a
  valid pattern) is logged with file and line number, skipped and counted
  (`skipped_records`, reported in the run's metrics). A file with no usable record is a
  configuration error.
- Held-out split: `eval_fraction` of the records, chosen by a permutation seeded by the
  run seed, is kept for evaluation only.
- Training order: epoch e visits the training records in a permutation seeded by (run
  seed, task, e), so problem i is a pure function of i and a cursor is enough to resume
  without repeating or skipping a record.
- An optional `reference` field is the warm-start target; it defaults to `answer`.
- parquet needs pyarrow, imported only when a parquet file is configured.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.seeds import derive_seed, text_key
from tidal.orchestrator.task_config import DatasetTaskConfig
from tidal.orchestrator.tasks.answer_checkers import CHECKERS, extract_answer
from tidal.orchestrator.tasks.base import Problem, Split, Task, Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    prompt: str
    answer: str
    reference: str
    line: int


def parse_record(raw: Any, *, regex: bool) -> tuple[str, str, str]:
    """(prompt, answer, reference) of one record; ValueError naming what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    prompt, answer = raw.get("prompt"), raw.get("answer")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("'prompt' must be a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ValueError("'answer' must be a string or a number")
    answer = str(answer)
    if regex:
        try:
            re.compile(answer)
        except re.error as exc:
            raise ValueError(f"'answer' is not a valid regex: {exc}") from exc
    reference = raw.get("reference", answer)
    if not isinstance(reference, str):
        raise ValueError("'reference' must be a string")
    return prompt, answer, reference


def read_rows(path: Path) -> list[tuple[int, Any]]:
    """(line or row number, decoded object or the exception) for every record in the file."""
    if not path.is_file():
        raise ConfigError(f"orchestrator task dataset: no file {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ConfigError(f"reading {path} needs pyarrow: pip install pyarrow") from exc
        return list(enumerate(pq.read_table(path).to_pylist(), start=1))
    rows: list[tuple[int, Any]] = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                rows.append((number, exc))
    return rows


class DatasetTask(Task):
    name = "dataset"

    def __init__(self, config: DatasetTaskConfig) -> None:
        self.config = config
        self.check = CHECKERS[config.verifier]
        try:
            self.extract = re.compile(config.extract) if config.extract else None
        except re.error as exc:
            raise ConfigError(f"orchestrator task {config.path}: extract: {exc}") from exc
        if self.extract is not None and self.extract.groups != 1:
            raise ConfigError(f"orchestrator task {config.path}: extract needs exactly one group")
        self.records: list[Record] = []
        self.skipped_records = 0
        for number, raw in read_rows(config.path):
            try:
                if isinstance(raw, Exception):
                    raise ValueError(f"not valid JSON ({raw})")
                prompt, answer, reference = parse_record(raw, regex=config.verifier == "regex")
            except ValueError as exc:
                self.skipped_records += 1
                log.warning("%s:%d: skipped: %s", config.path, number, exc)
                continue
            self.records.append(Record(prompt, answer, reference, number))
        if not self.records:
            raise ConfigError(f"orchestrator task {config.path}: no usable records")
        self.bind(name=self.name, seed=0)

    def bind(self, *, name: str, seed: int) -> None:
        super().bind(name=name, seed=seed)
        order = list(range(len(self.records)))
        random.Random(derive_seed(seed, text_key(name), 0)).shuffle(order)
        held_out = round(len(order) * self.config.eval_fraction)
        if held_out == len(order):
            held_out -= 1  # keep at least one training record
        self._splits: dict[str, list[int]] = {"eval": order[:held_out], "train": order[held_out:]}
        self._epoch_orders: dict[int, list[int]] = {}

    def size(self, split: Split = "train") -> int:
        return len(self._splits[split])

    def _epoch_order(self, epoch: int) -> list[int]:
        if epoch not in self._epoch_orders:
            order = list(self._splits["train"])
            random.Random(derive_seed(self.seed, text_key(self.name), 1, epoch)).shuffle(order)
            self._epoch_orders = {epoch: order}  # one epoch cached at a time
        return self._epoch_orders[epoch]

    def problem(self, index: int, *, split: Split = "train") -> Problem:
        if split == "eval":
            record = self.records[self._splits["eval"][index]]
        else:
            epoch, offset = divmod(index, len(self._splits["train"]))
            record = self.records[self._epoch_order(epoch)[offset]]
        return Problem(
            prompt=record.prompt,
            reference=record.reference,
            answer=record.answer,
            task=self.name,
            uid=f"{self.name}/{split}/{index}/line{record.line}",
        )

    def verify(self, problem: Problem, completion: str) -> Verdict:
        extracted = extract_answer(completion, self.extract)
        if extracted is None:
            return Verdict(0.0, {"extracted": 0.0})
        return Verdict(float(self.check(extracted, problem.answer)), {"extracted": 1.0})

    @property
    def max_completion_chars(self) -> int:
        return self.config.max_answer_chars
