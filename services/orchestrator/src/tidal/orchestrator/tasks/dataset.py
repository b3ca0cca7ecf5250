"""A task from local records (JSONL, JSON, parquet, Arrow, `datasets` folders) and a verifier.

Reading is data_files.py and field mapping records.py; this module owns splits, order and
scoring. A bad record is logged and counted and never stops a run; a field no record has is
a `ConfigError`. Epoch e visits the training records in a permutation seeded by (run seed,
task, e), so problem i is a pure function of i and resume needs only a cursor.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from pathlib import Path

from tidal.common.errors import ConfigError
from tidal.orchestrator.seeds import derive_seed, text_key
from tidal.orchestrator.task_config import DatasetTaskConfig
from tidal.orchestrator.tasks.answer_checkers import CHECKERS, extract_answer
from tidal.orchestrator.tasks.base import Problem, Split, Task, Verdict
from tidal.orchestrator.tasks.data_files import Rows, read_rows
from tidal.orchestrator.tasks.records import FieldMap, Record, parse_record

log = logging.getLogger(__name__)

__all__ = ["DatasetTask", "Record", "load_records"]


def _check_fields(rows: Rows, fields: FieldMap) -> None:
    present = rows.fields()
    if not rows.rows or not present:
        return  # nothing to check against; "no usable records" says it
    missing = [name for name in fields.required() if name not in present]
    if missing:
        raise ConfigError(
            f"orchestrator task {rows.label}: no field {missing[0]!r} "
            f"(fields: {', '.join(present)}); set the task's *_field keys"
        )


def load_records(
    path: Path, fields: FieldMap, *, split: str | None, regex: bool
) -> tuple[list[Record], int]:
    """The usable records of a source and how many were skipped."""
    rows = read_rows(path, split=split)
    _check_fields(rows, fields)
    records: list[Record] = []
    skipped = 0
    for number, raw in rows.rows:
        try:
            if isinstance(raw, Exception):
                raise ValueError(f"not valid JSON ({raw})")
            records.append(parse_record(raw, fields, line=number, regex=regex))
        except ValueError as exc:
            skipped += 1
            log.warning("%s:%d: skipped: %s", rows.label, number, exc)
    if not records:
        raise ConfigError(f"orchestrator task {rows.label}: no usable records")
    return records, skipped


class DatasetTask(Task):
    name = "dataset"

    def __init__(self, config: DatasetTaskConfig) -> None:
        self.config = config
        self.check = self._checker(config)
        try:
            self.extract = re.compile(config.extract) if config.extract else None
        except re.error as exc:
            raise ConfigError(f"orchestrator task {config.path}: extract: {exc}") from exc
        if self.extract is not None and self.extract.groups != 1:
            raise ConfigError(f"orchestrator task {config.path}: extract needs exactly one group")
        fields = FieldMap(
            prompt=config.prompt_field,
            messages=config.messages_field,
            answer=config.answer_field,
            reference=config.reference_field,
            metadata=tuple(config.metadata_fields),
        )
        regex = config.verifier == "regex"
        self.records, self.skipped_records = load_records(
            config.path, fields, split=config.split, regex=regex
        )
        self.eval_records: list[Record] | None = None
        if config.separate_eval:
            self.eval_records, skipped = load_records(
                config.eval_path or config.path, fields, split=config.eval_split, regex=regex
            )
            self.skipped_records += skipped
        self.bind(name=self.name, seed=0)

    @staticmethod
    def _checker(config: DatasetTaskConfig) -> Callable[[str, str], Verdict]:
        if config.verifier == "math":
            from tidal.orchestrator.tasks.math_answers import MathVerifier

            return MathVerifier(format_weight=config.format_weight).score
        check = CHECKERS[config.verifier]
        return lambda completion, answer: Verdict(float(check(completion, answer)))

    def bind(self, *, name: str, seed: int) -> None:
        super().bind(name=name, seed=seed)
        order = list(range(len(self.records)))
        random.Random(derive_seed(seed, text_key(name), 0)).shuffle(order)
        held_out = 0
        if self.eval_records is None:
            held_out = round(len(order) * self.config.held_out_fraction)
            if held_out == len(order):
                held_out -= 1  # keep at least one training record
        self._splits: dict[str, list[int]] = {"eval": order[:held_out], "train": order[held_out:]}
        self._epoch_orders: dict[int, list[int]] = {}

    def size(self, split: Split = "train") -> int:
        if split == "eval" and self.eval_records is not None:
            return len(self.eval_records)
        return len(self._splits[split])

    def _epoch_order(self, epoch: int) -> list[int]:
        if epoch not in self._epoch_orders:
            order = list(self._splits["train"])
            random.Random(derive_seed(self.seed, text_key(self.name), 1, epoch)).shuffle(order)
            self._epoch_orders = {epoch: order}  # one epoch cached at a time
        return self._epoch_orders[epoch]

    def problem(self, index: int, *, split: Split = "train") -> Problem:
        if split == "eval" and self.eval_records is not None:
            record = self.eval_records[index]
        elif split == "eval":
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
            key=f"{self.name}/{split}/line{record.line}",
            messages=record.messages,
            metadata=dict(record.metadata),
        )

    def verify(self, problem: Problem, completion: str) -> Verdict:
        extracted = extract_answer(completion, self.extract)
        if self.config.verifier == "math":
            if extracted is None:
                return Verdict(0.0, {"format": 0.0, "answer": 0.0})
            return self.check(extracted, problem.answer)
        if extracted is None:
            return Verdict(0.0, {"extracted": 0.0})
        return Verdict(self.check(extracted, problem.answer).reward, {"extracted": 1.0})

    @property
    def max_completion_chars(self) -> int:
        return self.config.max_answer_chars
