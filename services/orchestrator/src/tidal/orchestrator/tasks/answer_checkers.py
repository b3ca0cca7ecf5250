"""Answer checkers shared by tasks: exact match, numeric match, regex match, extraction.

Decisions:
- Each checker is a pure function `(completion, answer) -> bool`; tasks turn that into a
  reward. Keeping them free of task state makes them reusable by plug-in tasks.
- Numeric matching compares exact rationals (`fractions.Fraction` from a decimal string),
  not floats, after removing formatting people use: thousands separators, spaces,
  underscores, a leading '+', a currency sign, a trailing '.'. So "1,000" == "1000.0" and
  "0.1" == ".10", while "0.30000000000000004" != "0.3".
- Regex matching uses the record's answer as the pattern and requires a full match of
  the stripped completion, so "\\d+" does not accept "12 apples".
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_NUMBER_NOISE = re.compile(r"[,\s_$€£]")


def parse_number(text: str) -> Fraction | None:
    """The exact value of a formatted number ("1,234.50", "-3", "2/3", "1e3"); None if not one."""
    cleaned = _NUMBER_NOISE.sub("", text.strip()).removeprefix("+").rstrip(".")
    if not cleaned:
        return None
    try:
        if "/" in cleaned:
            numerator, _, denominator = cleaned.partition("/")
            return Fraction(int(numerator), int(denominator))
        value = Decimal(cleaned)
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None
    if not value.is_finite():
        return None
    return Fraction(value)


def exact_match(completion: str, answer: str) -> bool:
    return completion.strip() == answer.strip()


def numeric_match(completion: str, answer: str) -> bool:
    got, want = parse_number(completion), parse_number(answer)
    return got is not None and want is not None and got == want


def regex_match(completion: str, pattern: str) -> bool:
    return re.fullmatch(pattern, completion.strip()) is not None


def extract_answer(completion: str, pattern: re.Pattern[str] | None) -> str | None:
    """The first group of `pattern`'s first match in `completion` (the whole completion
    without a pattern); None when the pattern does not match."""
    if pattern is None:
        return completion
    found = pattern.search(completion)
    return None if found is None else found.group(1)


CHECKERS = {"exact": exact_match, "numeric": numeric_match, "regex": regex_match}
