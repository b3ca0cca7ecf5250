"""A judge's prompt from its rubric, and its reply back into a reward in [0, 1].

Rendering substitutes every placeholder in one pass, so a completion that contains
`{reference}` is sent as written, never filled in. Parsing reads the last score the judge
gave (judges reason first and conclude last) after dropping `<think>` blocks; a reply
with no usable score is `None`, which the caller scores 0 and counts.
"""

from __future__ import annotations

import math
import re

from tidal.orchestrator.scoring.model_reward_config import PLACEHOLDERS, JudgeRewardConfig

_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)")


def render_rubric(rubric: str, **values: str) -> str:
    """`rubric` with `{prompt}`, `{completion}`, `{reference}` and `{answer}` replaced."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), ""), rubric)


def parse_score(reply: str, config: JudgeRewardConfig) -> float | None:
    """The reward a judge's reply gives, in [0, 1]; None when it gives none."""
    text = _THINK.sub("", reply)
    if config.score == "verdict":
        return _verdict(text, config.verdicts)
    pattern = re.compile(config.pattern) if config.pattern else _NUMBER
    found = pattern.findall(text)
    if not found:
        return None
    try:
        value = float(found[-1])
    except ValueError:
        return None
    if not (math.isfinite(value) and config.min_score <= value <= config.max_score):
        return None
    return (value - config.min_score) / (config.max_score - config.min_score)


def _verdict(text: str, verdicts: dict[str, float]) -> float | None:
    words = sorted(verdicts, key=len, reverse=True)  # "incorrect" before "correct"
    alternatives = "|".join(re.escape(w) for w in words)
    found = re.findall(rf"(?<!\w)({alternatives})(?!\w)", text, flags=re.IGNORECASE)
    if not found:
        return None
    by_lower = {w.lower(): r for w, r in verdicts.items()}
    return by_lower[found[-1].lower()]
