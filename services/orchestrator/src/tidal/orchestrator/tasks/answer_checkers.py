"""Answer checkers shared by tasks: exact match, numeric match, regex match, extraction.

Each is a pure `(completion, answer) -> bool`, reusable by plug-in tasks. Numbers compare as
exact rationals after removing formatting ("1,000" == "1000.0", "0.1" == ".10", but
"0.30000000000000004" != "0.3"); a regex answer must fully match the stripped completion.
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
