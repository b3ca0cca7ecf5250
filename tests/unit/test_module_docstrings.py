"""Docstrings and help text are timeless: they say what the code does and why, never
which ticket asked for it, a figure once measured, or what the code did before. History
lives in CHANGELOG.md and commit messages, figures in docs/benchmarks/, design reasoning
in docs/.

The rule covers every docstring in the source (module, class, function, and the
attribute docstrings that are the config fields' help) and every help text (`tidal
--help`, each command's `--help all`, the argparse helps); TIMELESS holds its patterns:
ticket references, measured quantities (an exact setting such as a size limit or an
interval passes), and wording about former behaviour. Module docstrings are stricter:
no benchmark vocabulary or time units at all, no `Decisions:` block, a few lines only.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [*ROOT.glob("services/*/src"), *ROOT.glob("libs/*/src"), ROOT / "src"]
MAX_LINES = 12
MAX_MEDIAN_LINES = 8
NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)?"
TIMELESS = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+|(?<![\w&])#\d+\b", re.I),
    "a benchmark figure": re.compile(
        rf"[~≈]\s*{NUMBER}\s*(?:s|ms|µs|us|min|x|×)(?!\w)|{NUMBER}\s*[x×](?!\w)|"
        rf"{NUMBER}\s*[A-Za-z]+/s\b|{NUMBER}\s*%|\b(?:faster|slower) than\b|speed-?up",
        re.I,
    ),
    "a former behaviour": re.compile(
        r"\bused to\b|\bpreviously\b|\bformerly\b|\bno longer\b|\banymore\b|\blegacy\b|"
        r"\bwas (?:replaced|renamed|removed|changed)\b|\brenamed from\b|\(was\b|"
        r"\bbefore (?:this change|issue)\b|\bthe old (?:default|behaviou?r)\b|"
        r"\b(?:is|are) now (?:an?|optional|required|refused|removed)\b",
        re.I,
    ),
}
MODULE_ONLY = {
    "a benchmark": re.compile(r"\bmeasured\b|\bbenchmark|\d\s*(ms|µs|us)\b", re.I),
    "a Decisions block": re.compile(r"^\s*(Design )?Decisions?:", re.M),
}
CONFIG_COMMANDS = ("rl", "sft", "export", "plan")
SERVICES = ("orchestrator", "inference", "trainer", "weightsync")
CLIENT_COMMANDS = ("status", "generate", "versions", "progress")
HELP_COMMANDS = [
    ["--help"],
    *([command, "--help", "all"] for command in (*CONFIG_COMMANDS, *SERVICES)),
    ["client", "--help"],
    *(["client", command, "--help"] for command in CLIENT_COMMANDS),
    ["certs", "--help"],
]


def source_modules() -> list[Path]:
    return sorted(
        path
        for root in SOURCE_ROOTS
        for path in root.rglob("*.py")
        if "tidal/rpc" not in path.as_posix()
    )


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text()), clean=True) or ""


def inner_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every class, function and attribute docstring of a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            is_str = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            if not (is_str and isinstance(stmt.value.value, str)):
                continue
            owned = i == 0 and isinstance(
                node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            )
            if owned or (i > 0 and isinstance(body[i - 1], ast.AnnAssign | ast.Assign)):
                found.append((stmt.lineno, " ".join(stmt.value.value.split())))
    return found


def problems(doc: str, rules: dict[str, re.Pattern[str]] = TIMELESS) -> list[str]:
    return [f"cites {what}: {m.group(0)!r}" for what, rx in rules.items() if (m := rx.search(doc))]


def module_problems(doc: str) -> list[str]:
    found = problems(doc) + problems(doc, MODULE_ONLY)
    if len(doc.splitlines()) > MAX_LINES:
        found.append(f"{len(doc.splitlines())} lines, at most {MAX_LINES}")
    return found


def help_output(argv: list[str]) -> str:
    """What `tidal ARGV` prints before it exits."""
    from tidal.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(argv)
    return out.getvalue()


def _id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", source_modules(), ids=_id)
def test_a_module_docstring_is_short_and_timeless(path: Path) -> None:
    assert module_problems(docstring(path)) == []


@pytest.mark.parametrize("path", source_modules(), ids=_id)
def test_class_function_and_field_docstrings_are_timeless(path: Path) -> None:
    found = [f"line {line}: {p}" for line, doc in inner_docstrings(path) for p in problems(doc)]
    assert found == []


@pytest.mark.parametrize("argv", HELP_COMMANDS, ids=" ".join)
def test_help_text_is_timeless(argv: list[str]) -> None:
    text = help_output(argv)
    assert text.strip()
    assert problems(" ".join(text.split())) == []


def test_the_health_probe_help_is_timeless() -> None:
    from tidal.common.grpc.health_probe import _parser

    assert problems(_parser().format_help()) == []


def test_the_median_module_docstring_is_a_few_lines() -> None:
    lengths = [len(docstring(path).splitlines()) for path in source_modules()]
    assert statistics.median(lengths) <= MAX_MEDIAN_LINES


@pytest.mark.parametrize(
    "text",
    [
        "Fixes issue 12.",
        "See #12.",
        "A checkpoint costs ~1.2 s.",
        "The fused kernel is 1.9× quicker.",
        "About 3x less memory.",
        "Streams at 400 MB/s.",
        "Decodes 90 tokens/s.",
        "Cuts step time by 12 %.",
        "Faster than before.",
        "It used to poll.",
        "The key was renamed.",
        "The key is now optional.",
        "Redials every 0.5 s (was 1 s).",
        "A replica no longer pins it.",
    ],
)
def test_the_rules_catch_what_they_name(text: str) -> None:
    assert problems(text)


@pytest.mark.parametrize(
    "text",
    [
        "Packs samples into micro-batches; files are written 0600.",
        '"auto" sizes chunks to 64 MiB of fp32 logits.',
        "Redials every 0.5 s; 2 s by default.",
        "Rank r of each adapter (A is r × in, B is out × r); ids like 0x1f.",
        "Requests the replica can answer now.",
    ],
)
def test_the_rules_let_settings_and_units_pass(text: str) -> None:
    assert problems(text) == []


def test_module_docstrings_are_held_to_more() -> None:
    assert module_problems("Took 40 ms (measured).") and module_problems("Decisions:\n- one")
    assert module_problems("\n".join(["line"] * (MAX_LINES + 1)))
