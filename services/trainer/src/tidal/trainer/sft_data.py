"""Supervised fine-tuning data: prompt/completion or chat records from disk, tokenized, in a
fixed order.

Records come from JSONL or Parquet; a record with `messages` is a conversation, any other
needs the prompt and completion fields. A bad record is an error naming the file, record
and key, never a silent skip. Tokens go through `tidal.text.ChatRendering`, as RL prompts
do; conversations train on their assistant turns only. Samples go through the RL packer.
The order is a pure function of the position (epoch e is a shuffle seeded with (seed, e)),
so a checkpoint stores only the position and a resumed run draws the same batches.
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
from tidal.text.conversation import ChatRendering
from tidal.text.episode import Episode

DataFormat = Literal["auto", "jsonl", "parquet"]
MESSAGES_KEY = "messages"


@dataclass(frozen=True)
class PromptCompletion:
    prompt: str
    completion: str


@dataclass(frozen=True)
class Conversation:
    """A chat record: its assistant turns are trained, every other token is masked."""

    messages: tuple[dict[str, Any], ...]


Record = PromptCompletion | Conversation


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


def _conversation(path: Path, number: int, value: Any) -> Conversation:
    where = f"{path}, record {number}: {MESSAGES_KEY!r}"
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ConfigError(f"{where} must be a list of {{role, content}} objects")
    for i, message in enumerate(value):
        if not isinstance(message.get("role"), str):
            raise ConfigError(f"{where}[{i}] has no string 'role' (has {sorted(message)})")
    if not any(m["role"] == "assistant" for m in value) or value[0]["role"] == "assistant":
        raise ConfigError(
            f"{where} needs an assistant message to train on, after the opening message"
        )
    return Conversation(tuple(value))


def _prompt_completion(
    path: Path, number: int, row: dict[str, Any], prompt_key: str, completion_key: str
) -> PromptCompletion:
    for key in (prompt_key, completion_key):
        if key not in row:
            raise ConfigError(
                f"{path}, record {number}: missing key {key!r} (has {sorted(row)}; "
                f"a chat record has {MESSAGES_KEY!r})"
            )
        if not isinstance(row[key], str):
            raise ConfigError(
                f"{path}, record {number}: {key!r} must be a string, got {type(row[key]).__name__}"
            )
    return PromptCompletion(row[prompt_key], row[completion_key])


def read_records(
    path: Path, *, prompt_key: str, completion_key: str, fmt: DataFormat = "auto"
) -> list[Record]:
    """All records of `path`; raises ConfigError naming the record and key that is wrong."""
    if not path.is_file():
        raise ConfigError(f"sft.data.path: {path} does not exist")
    if fmt == "auto":
        suffix = path.suffix.lower()
        fmt = "parquet" if suffix in (".parquet", ".pq") else "jsonl"
    rows = _read_parquet(path) if fmt == "parquet" else _read_jsonl(path)
    records: list[Record] = [
        _conversation(path, number, row[MESSAGES_KEY])
        if MESSAGES_KEY in row
        else _prompt_completion(path, number, row, prompt_key, completion_key)
        for number, row in enumerate(rows, start=1)
    ]
    if not records:
        raise ConfigError(f"{path}: no records")
    return records


def _from_episode(episode: Episode) -> TrainSample:
    prompt_len = episode.loss_mask.index(1)
    mask = tuple(float(m) for m in episode.loss_mask[prompt_len:])
    return TrainSample(
        tuple(episode.ids[:prompt_len]),
        tuple(episode.ids[prompt_len:]),
        advantage=1.0,
        completion_mask=() if all(mask) else mask,
    )


def to_sample(record: Record, rendering: ChatRendering) -> TrainSample:
    """One record's ids, prompt masked, and (conversations) non-assistant turns masked."""
    if isinstance(record, Conversation):
        return _from_episode(rendering.conversation(record.messages))
    if rendering.template:
        chat = [
            {"role": "user", "content": record.prompt},
            {"role": "assistant", "content": record.completion},
        ]
        return _from_episode(rendering.conversation(chat))
    tokenizer = rendering.tokenizer
    prompt = tuple(tokenizer.encode(record.prompt))
    completion = (
        *tokenizer.encode(record.completion, add_special_tokens=False),
        tokenizer.eos_id,
    )
    return TrainSample(prompt, completion, advantage=1.0)


def to_samples(
    records: Sequence[Record], rendering: ChatRendering, *, max_seq_len: int
) -> list[TrainSample]:
    """Tokenize; a record longer than `max_seq_len` tokens is an error naming it."""
    samples = []
    for number, record in enumerate(records, start=1):
        sample = to_sample(record, rendering)
        length = len(sample.prompt_ids) + len(sample.completion_ids)
        if length > max_seq_len:
            raise ConfigError(
                f"record {number} has {length} tokens, more than "
                f"trainer.model.max_seq_len {max_seq_len}"
            )
        samples.append(sample)
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
