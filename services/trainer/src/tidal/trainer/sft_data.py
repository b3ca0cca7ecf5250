"""Supervised fine-tuning data: prompt/completion records from disk, tokenized, in a fixed order.

Decisions:
- Records come from JSONL (one object per line) or Parquet (via pyarrow), each with a
  prompt and a completion field (names configurable). A bad record is an error naming
  the file, the record number and the key, never a silent skip: a silently shrunk
  dataset is worse than a stopped run.
- Tokens: prompt = BOS + prompt bytes, completion = completion bytes + EOS. Samples become
  `tidal.batch` `TrainSample`s (advantage 1, no behaviour logprobs) and go through the
  same `pack_micro_batches` as RL steps, so prompt tokens are masked (loss_mask 0) by the
  same code and the trainer sees the same packed `[1, T]` micro-batches.
- The data order is a pure function of the *position* (samples consumed so far): epoch e
  is a shuffle seeded with (seed, e). A checkpoint stores only the position, and a resumed
  run draws exactly the batches it would have drawn.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tidal.batch.packing import TrainSample
from tidal.common.errors import ConfigError
from tidal.common.tokenizer import ByteTokenizer

DataFormat = Literal["auto", "jsonl", "parquet"]


@dataclass(frozen=True)
class PromptCompletion:
    prompt: str
    completion: str


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}, line {number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}, line {number}: expected a JSON object")
            rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq  # only Parquet needs it; JSONL works without
    except ImportError:
        raise ConfigError(
            f"{path}: reading Parquet needs pyarrow (pip install pyarrow); or use JSONL"
        ) from None
    return pq.read_table(path).to_pylist()


def read_records(
    path: Path, *, prompt_key: str, completion_key: str, fmt: DataFormat = "auto"
) -> list[PromptCompletion]:
    """All records of `path`; raises ConfigError naming the record and key that is wrong."""
    if not path.is_file():
        raise ConfigError(f"sft.data.path: {path} does not exist")
    if fmt == "auto":
        suffix = path.suffix.lower()
        fmt = "parquet" if suffix in (".parquet", ".pq") else "jsonl"
    rows = _read_parquet(path) if fmt == "parquet" else _read_jsonl(path)
    records = []
    for number, row in enumerate(rows, start=1):
        for key in (prompt_key, completion_key):
            if key not in row:
                raise ConfigError(
                    f"{path}, record {number}: missing key {key!r} (has {sorted(row)})"
                )
            if not isinstance(row[key], str):
                raise ConfigError(
                    f"{path}, record {number}: {key!r} must be a string, "
                    f"got {type(row[key]).__name__}"
                )
        records.append(PromptCompletion(row[prompt_key], row[completion_key]))
    if not records:
        raise ConfigError(f"{path}: no records")
    return records


def to_samples(
    records: Sequence[PromptCompletion], tokenizer: ByteTokenizer, *, max_seq_len: int
) -> list[TrainSample]:
    """Tokenize; a record longer than `max_seq_len` tokens is an error naming it."""
    samples = []
    for number, record in enumerate(records, start=1):
        prompt = tuple(tokenizer.encode(record.prompt))
        completion = (*tokenizer.encode(record.completion, add_bos=False), tokenizer.eos_id)
        if len(prompt) + len(completion) > max_seq_len:
            raise ConfigError(
                f"record {number} has {len(prompt) + len(completion)} tokens, more than "
                f"trainer.model.max_seq_len {max_seq_len}"
            )
        samples.append(TrainSample(prompt, completion, advantage=1.0))
    return samples


class SampleOrder:
    """Batches of samples by position: epoch e visits all samples in a (seed, e) shuffle."""

    def __init__(self, samples: Sequence[TrainSample], *, seed: int) -> None:
        self.samples = list(samples)
        self.seed = seed
        self._epoch = -1
        self._order: list[int] = []

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            order = list(range(len(self.samples)))
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
            self._epoch, self._order = epoch, order
        return self._order

    def batch(self, position: int, size: int) -> tuple[list[TrainSample], int]:
        """`size` samples starting at `position`, and the position after them."""
        n = len(self.samples)
        picked = [
            self.samples[self._permutation(p // n)[p % n]] for p in range(position, position + size)
        ]
        return picked, position + size
