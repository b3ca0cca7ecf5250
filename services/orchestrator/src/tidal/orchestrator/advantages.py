"""Advantage estimators over one prompt's group of completions, and reward shaping.

No value model: every estimator (grpo, dr_grpo, rloo, remax) takes its baseline from the
same prompt's group. A group whose rewards are all equal gets exact zeros (remax keeps its
greedy baseline), which is what dynamic sampling drops (`has_signal`). Shaping (overlong
and length penalties) changes the reward before advantages are computed; metrics keep the
verifier's raw reward. The formulas are in docs/orchestrator.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EPS = 1e-6
ALGORITHMS = ("grpo", "dr_grpo", "rloo", "remax")


def has_signal(rewards: Sequence[float] | np.ndarray) -> bool:
    """True when the group's rewards are not all equal."""
    return len(rewards) > 0 and float(np.ptp(np.asarray(rewards, dtype=np.float64))) > 0.0


def group_advantages(
    rewards: Sequence[float], *, normalize: bool = True, eps: float = EPS
) -> np.ndarray:
    """GRPO advantages of one group's completions, float32 `[G]`."""
    r = np.asarray(rewards, dtype=np.float64)  # (G,)
    # Test equality directly: the mean of equal floats need not equal them exactly, so
    # `r - r.mean()` can be ~1e-16 where the answer is 0.
    if not has_signal(r):
        return np.zeros_like(r, dtype=np.float32)
    centred = r - r.mean()
    if normalize:
        centred = centred / (r.std() + eps)
    return centred.astype(np.float32)


def rloo_advantages(rewards: Sequence[float]) -> np.ndarray:
    """Leave-one-out: each reward minus the mean of the other rewards of its group."""
    r = np.asarray(rewards, dtype=np.float64)  # (G,)
    if r.size < 2 or not has_signal(r):
        return np.zeros_like(r, dtype=np.float32)
    others = (r.sum() - r) / (r.size - 1)  # (G,)
    return (r - others).astype(np.float32)


def remax_advantages(rewards: Sequence[float], greedy_reward: float) -> np.ndarray:
    """Each reward minus the reward of the prompt's greedy completion."""
    return (np.asarray(rewards, dtype=np.float64) - greedy_reward).astype(np.float32)


def compute_advantages(
    algorithm: str,
    rewards: Sequence[float],
    *,
    normalize: bool = True,
    greedy_reward: float | None = None,
) -> np.ndarray:
    """Advantages of one group under `algorithm` (one of ALGORITHMS)."""
    if algorithm == "grpo":
        return group_advantages(rewards, normalize=normalize)
    if algorithm == "dr_grpo":
        return group_advantages(rewards, normalize=False)
    if algorithm == "rloo":
        return rloo_advantages(rewards)
    if algorithm == "remax":
        if greedy_reward is None:
            raise ValueError("remax needs the reward of the prompt's greedy completion")
        return remax_advantages(rewards, greedy_reward)
    raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")


def grpo_advantages(
    groups: Sequence[Sequence[float]], *, normalize: bool = True
) -> list[np.ndarray]:
    """Per-group GRPO advantages for a batch of groups (one group per prompt)."""
    return [group_advantages(g, normalize=normalize) for g in groups]


def overlong_penalty(length: int, max_tokens: int, *, buffer: int, penalty: float) -> float:
    """DAPO soft overlong punishment: 0 up to max_tokens - buffer, then linear to `penalty`."""
    start = max_tokens - buffer
    if buffer <= 0 or length <= start:
        return 0.0
    return penalty * min(1.0, (length - start) / buffer)


def shape_reward(
    reward: float,
    length: int,
    max_tokens: int,
    *,
    overlong_buffer: int = 0,
    overlong_max_penalty: float = 1.0,
    length_penalty: float = 0.0,
) -> float:
    """The reward advantages are computed from: verifier reward minus the penalties."""
    shaped = reward - overlong_penalty(
        length, max_tokens, buffer=overlong_buffer, penalty=overlong_max_penalty
    )
    return shaped - length_penalty * length / max_tokens
