"""Module docstrings say what a module does, its invariant and why it is shaped so, in a few
lines: no issue numbers, benchmark figures or history (those live in docs/benchmarks/ and
commit messages), no long `Decisions:` blocks (design reasoning lives in docs/)."""

from __future__ import annotations

import ast
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [*ROOT.glob("services/*/src"), *ROOT.glob("libs/*/src"), ROOT / "src"]
MAX_LINES = 12
MAX_MEDIAN_LINES = 8
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+|(?<![\w&])#\d+\b", re.I),
    "a benchmark figure": re.compile(
        r"\bmeasured\b|\bbenchmark|docs/benchmarks|\d\s*(ms|µs|us)\b|"
        r"\b(faster|slower) than\b|speed-?up|\d+(\.\d+)?\s*(GB|MB|MiB|GiB|KB)/s",
        re.I,
    ),
    "a former behaviour": re.compile(
        r"\bused to\b|\bpreviously\b|\bformerly\b|\bno longer\b|\bwas replaced\b|"
        r"\bbefore this change\b|\blegacy\b",
        re.I,
    ),
    "a Decisions block": re.compile(r"^\s*(Design )?Decisions?:", re.M),
}


def source_modules() -> list[Path]:
    return sorted(
        path
        for root in SOURCE_ROOTS
        for path in root.rglob("*.py")
        if "tidal/rpc" not in path.as_posix()
    )


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text()), clean=True) or ""


def problems(doc: str) -> list[str]:
    found = [
        f"cites {what}: {m.group(0)!r}" for what, rx in FORBIDDEN.items() if (m := rx.search(doc))
    ]
    if len(doc.splitlines()) > MAX_LINES:
        found.append(f"{len(doc.splitlines())} lines, at most {MAX_LINES}")
    return found


@pytest.mark.parametrize("path", source_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_module_docstring_is_short_and_timeless(path: Path) -> None:
    assert problems(docstring(path)) == []


def test_the_median_module_docstring_is_a_few_lines() -> None:
    lengths = [len(docstring(path).splitlines()) for path in source_modules()]
    assert statistics.median(lengths) <= MAX_MEDIAN_LINES


def test_the_rules_catch_what_they_name() -> None:
    assert problems("Fixes issue 12.") and problems("Took 40 ms (measured).")
    assert problems("It used to poll.") and problems("Decisions:\n- one")
    assert problems("\n".join(["line"] * (MAX_LINES + 1)))
    assert problems("Packs samples into micro-batches; files are written 0600.") == []
