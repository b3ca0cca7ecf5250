"""One dataset record → prompt, chat messages, answer, reference and verifier metadata.

Field names come from the task config. An unusable record raises `ValueError` naming the
field, and the caller skips it; whether a field is missing from the whole source is the
caller's decision, which sees every record. Chat messages are kept as given;
`render_messages` makes the plain prompt of plain-text runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class FieldMap:
    """Which record fields hold what (the dataset task config's `*_field` keys)."""

    prompt: str = "prompt"
    messages: str | None = None
    answer: str = "answer"
    reference: str = "reference"
    metadata: tuple[str, ...] = ()

    def required(self) -> list[str]:
        """Fields every source must have somewhere (the reference is optional)."""
        return [self.messages or self.prompt, self.answer, *self.metadata]


@dataclass(frozen=True)
class Record:
    prompt: str
    answer: str
    reference: str
    line: int
    messages: tuple[dict[str, str], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)


def render_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """Plain prompt text of chat messages: `role: content` lines, then `assistant: `."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant: "])


def parse_messages(raw: Any, name: str) -> tuple[dict[str, str], ...]:
    """Validated chat messages; ValueError naming what is wrong."""
    if not isinstance(raw, list | tuple) or not raw:
        raise ValueError(f"{name!r} must be a non-empty list of {{role, content}} messages")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, Mapping):
            raise ValueError(f"{name!r}[{i}] must be an object with 'role' and 'content'")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES or not isinstance(content, str):
            raise ValueError(
                f"{name!r}[{i}] needs a role in {list(ROLES)} and a string content, "
                f"got role {role!r}"
            )
        messages.append({"role": role, "content": content})
    return tuple(messages)


def _field(raw: Mapping[str, Any], name: str) -> Any:
    if name not in raw:
        raise KeyError(name)
    return raw[name]


def _present(raw: Mapping[str, Any]) -> str:
    return f"(fields: {', '.join(sorted(map(str, raw)))})"


def parse_record(raw: Any, fields: FieldMap, *, line: int, regex: bool) -> Record:
    """The record of one decoded row; ValueError naming what is wrong."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    messages: tuple[dict[str, str], ...] = ()
    if fields.messages is not None:
        messages = parse_messages(raw.get(fields.messages), fields.messages)
        prompt = render_messages(messages)
    else:
        prompt = raw.get(fields.prompt)
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{fields.prompt!r} must be a non-empty string {_present(raw)}")
    answer = raw.get(fields.answer)
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ValueError(f"{fields.answer!r} must be a string or a number {_present(raw)}")
    answer = str(answer)
    if regex:
        try:
            re.compile(answer)
        except re.error as exc:
            raise ValueError(f"{fields.answer!r} is not a valid regex: {exc}") from exc
    reference = raw.get(fields.reference)
    if reference is None:
        reference = answer
    if not isinstance(reference, str):
        raise ValueError(f"{fields.reference!r} must be a string {_present(raw)}")
    try:
        metadata = {name: _field(raw, name) for name in fields.metadata}
    except KeyError as exc:
        raise ValueError(f"metadata field {exc.args[0]!r} is missing {_present(raw)}") from None
    return Record(prompt, answer, reference, line, messages, metadata)
