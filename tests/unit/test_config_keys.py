"""The config keys are frozen in `config_keys.txt`, so that adding, removing or moving a key
is a change a reviewer sees: the file lists every key `tidal rl`, `tidal sft` and `tidal
export` read (a tagged section's keys once per type), with the commands reading it.

A key that moved stays answered by its section's `moved_keys` until its `moved_keys_until`.
Run this file (`.venv/bin/python tests/unit/test_config_keys.py`) to rewrite the list.
"""

from __future__ import annotations

import difflib
from datetime import date
from pathlib import Path

from pydantic import BaseModel

from tidal.cli.config import RunConfig
from tidal.common.config.help import Key, entries
from tidal.common.config.loading import BaseConfig
from tidal.trainer.config import SftRunConfig
from tidal.trainer.export import ExportRunConfig

KEYS_FILE = Path(__file__).with_name("config_keys.txt")
COMMANDS: dict[str, type[BaseModel]] = {
    "rl": RunConfig,
    "sft": SftRunConfig,
    "export": ExportRunConfig,
}


def key_lines() -> list[str]:
    """`path (variant)  commands` for every key, sorted by path."""
    readers: dict[str, list[str]] = {}
    for command, cls in COMMANDS.items():
        for entry in entries(cls):
            if isinstance(entry, Key):
                name = " ".join([entry.path, *(f"({note})" for note in entry.notes)])
                readers.setdefault(name, []).append(command)
    return [f"{name}  {' '.join(commands)}" for name, commands in sorted(readers.items())]


def _config_classes(cls: type = BaseConfig) -> list[type[BaseConfig]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_config_classes(sub))]


def test_the_config_keys_are_the_reviewed_list() -> None:
    frozen = KEYS_FILE.read_text().splitlines()
    now = key_lines()
    diff = "\n".join(
        difflib.unified_diff(frozen, now, KEYS_FILE.name, "the config classes", lineterm="")
    )
    assert frozen == now, (
        f"The config keys changed:\n{diff}\nIf that is meant, rewrite the list with "
        "`.venv/bin/python tests/unit/test_config_keys.py` and commit it with the change, "
        "so the review sees which keys came and went (and add the change to CHANGELOG.md)."
    )


def test_a_key_reads_as_a_path_of_lowercase_names() -> None:
    for line in key_lines():
        path = line.split()[0].replace("[]", "")
        assert all(part.isidentifier() and part.islower() for part in path.split(".")), line


def test_every_moved_key_table_says_until_when_and_names_no_live_key() -> None:
    for cls in _config_classes():
        if cls.moved_keys:
            assert date.fromisoformat(cls.moved_keys_until), cls.__name__
            assert not set(cls.moved_keys) & set(cls.model_fields), cls.__name__


if __name__ == "__main__":
    KEYS_FILE.write_text("\n".join(key_lines()) + "\n")
    print(f"{KEYS_FILE}: {len(key_lines())} keys")
