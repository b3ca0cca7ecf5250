"""Config values as users write them: TOML spelling for messages and `--help`.

Decisions:
- Values print as TOML (`"outputs"`, `[0.9, 0.95]`, `{}`), never Python reprs: a user
  copies them into a run file. None, which TOML cannot spell, prints as `unset`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import tomli_w
from pydantic_core import to_jsonable_python


def toml_value(value: Any) -> str:
    """A value as it would be written in TOML; None (no TOML spelling) as `unset`."""
    value = to_jsonable_python(value)
    if value is None:
        return "unset"
    if isinstance(value, dict):
        items = (f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value})[len("v = ") :].strip()


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
