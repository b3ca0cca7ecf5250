"""Answer checkers: exact, numeric (tolerant of formatting), regex, extraction."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from tidal.orchestrator.tasks.answer_checkers import (
    exact_match,
    extract_answer,
    numeric_match,
    parse_number,
    regex_match,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("19", Fraction(19)),
        (" 1,000 ", Fraction(1000)),
        ("19.0", Fraction(19)),
        ("+3.", Fraction(3)),
        ("-0.50", Fraction(-1, 2)),
        ("$1_234", Fraction(1234)),
        ("2/3", Fraction(2, 3)),
        ("1e3", Fraction(1000)),
    ],
)
def test_numbers_parse_to_exact_values(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1/0", "nan", "inf", "1.2.3"])
def test_non_numbers_parse_to_none(text: str) -> None:
    assert parse_number(text) is None


def test_numeric_match_ignores_formatting_but_not_value() -> None:
    assert numeric_match("1,000.0", "1000")
    assert numeric_match(".10", "0.1")
    assert not numeric_match("0.30000000000000004", "0.3")
    assert not numeric_match("twelve", "12")


def test_exact_match_strips_whitespace_only() -> None:
    assert exact_match(" Paris\n", "Paris")
    assert not exact_match("paris", "Paris")


def test_regex_match_needs_a_full_match() -> None:
    assert regex_match(" 42 ", r"\d+")
    assert not regex_match("42 apples", r"\d+")


def test_extract_takes_the_first_group() -> None:
    pattern = re.compile(r"answer:\s*(\S+)")
    assert extract_answer("so the answer: 12 ok", pattern) == "12"
    assert extract_answer("no idea", pattern) is None
    assert extract_answer("as is", None) == "as is"
