"""`tidal config-docs`: docs/config.md's key reference, written from the config classes.

The page keeps its hand-written introduction (everything above `MARKER`) and regenerates
the rest: one section per config section, each key with its type, default and docstring,
for `tidal rl` and then the keys only `tidal sft` and `tidal export` read. `make
config-check` regenerates into a temporary file and diffs, so the page never drifts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tidal.common.config.help import Entry, Heading, Key, entries, toml_value
from tidal.common.errors import ConfigError

PAGE = Path("docs/config.md")
MARKER = (
    "<!-- Generated below by `tidal config-docs` from the config classes: edit their "
    "docstrings, not this page. -->"
)
USAGE = "usage: tidal config-docs [--out FILE]   (rewrites docs/config.md below its marker line)"


def _cell(text: str, code: bool = False) -> str:
    text = text.replace("|", "\\|")
    return f"`{text}`" if code and text else text


def _row(key: Key) -> str:
    default = "required" if key.default is PydanticUndefined else toml_value(key.default)
    about = " ".join([*(f"({note})" for note in key.notes), key.doc, *key.more]).strip()
    cells = (_cell(key.path, True), _cell(key.kind, True), _cell(default, True), _cell(about))
    return "| " + " | ".join(cells) + " |"


def markdown(items: Sequence[Entry], top_level: str) -> list[str]:
    """Each section as a heading, its docstring and notes, and a table of its own keys."""
    lines: list[str] = []
    in_table = False
    for entry in items:
        if isinstance(entry, Heading):
            level = "##" if "." not in entry.path else "###"
            lines += ["", f"{level} {entry.path}", ""]
            lines += [line for text in (entry.doc, *entry.notes) if text for line in (text, "")]
            in_table = False
            continue
        if not lines:
            lines += ["", f"## {top_level}", ""]
        if not in_table:
            lines += ["| key | type | default | description |", "|---|---|---|---|"]
            in_table = True
        lines.append(_row(entry))
    return lines


def reference() -> str:
    """The generated part of docs/config.md."""
    from tidal.cli.config import RunConfig
    from tidal.trainer.config import SftRunConfig
    from tidal.trainer.export import ExportRunConfig

    commands: list[tuple[str, type[BaseModel]]] = [
        ("rl", RunConfig),
        ("sft", SftRunConfig),
        ("export", ExportRunConfig),
    ]
    listed = [(command, entries(cls)) for command, cls in commands]
    # A section one command reads is a key the others carry unchecked: listed as the section.
    sections = {e.path for _, items in listed for e in items if isinstance(e, Heading)}
    seen: set[str] = set()
    lines: list[str] = []
    for command, all_items in listed:
        items = [
            e
            for e in all_items
            if e.path not in seen and not (isinstance(e, Key) and e.path in sections)
        ]
        seen |= {e.path for e in items}
        if command != "rl":
            lines += ["", f"# Only `tidal {command}`"]
        lines += markdown(items, f"Top-level keys of `tidal {command}`")
    return "\n".join(lines).strip() + "\n"


def page(current: str) -> str:
    """`current` (the page as it is) with everything below its marker regenerated."""
    intro, found, _ = current.partition(MARKER)
    if not found:
        raise ConfigError(f"{PAGE} has no marker line {MARKER!r} to generate below")
    return f"{intro}{MARKER}\n\n{reference()}"


def main(argv: Sequence[str]) -> None:
    args = list(argv)
    if not (args == [] or (len(args) == 2 and args[0] == "--out")) or not PAGE.is_file():
        print(f"{USAGE}\nrun it in the repository root (where {PAGE} is)", file=sys.stderr)
        raise SystemExit(2)
    out = Path(args[-1]) if args else PAGE
    out.write_text(page(PAGE.read_text()))
