"""GRPO group advantages: each completion's reward relative to its own prompt's group.

Decisions:
- The baseline is the group mean (no value model): A_i = r_i - mean(r_group).
- With `normalize` (GRPO), A_i is further divided by the group's population std plus
  `eps`; without it (Dr.GRPO) the scale of rewards is kept, which avoids up-weighting
  groups whose rewards barely differ.
- A group whose rewards are all equal carries no learning signal and gets exact zeros
  (not eps-amplified noise), in both modes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EPS = 1e-6


def group_advantages(
    rewards: Sequence[float], *, normalize: bool = True, eps: float = EPS
) -> np.ndarray:
    """Advantages of one group's completions, float32 `[G]`."""
    r = np.asarray(rewards, dtype=np.float64)  # (G,)
    if r.size == 0:
        return np.zeros(0, dtype=np.float32)
    # Test equality directly: the mean of equal floats need not equal them exactly, so
    # `r - r.mean()` can be ~1e-16 where the answer is 0.
    if np.ptp(r) == 0.0:
        return np.zeros_like(r, dtype=np.float32)
    centred = r - r.mean()
    std = r.std()
    if normalize:
        centred = centred / (std + eps)
    return centred.astype(np.float32)


def grpo_advantages(
    groups: Sequence[Sequence[float]], *, normalize: bool = True
) -> list[np.ndarray]:
    """Per-group advantages for a batch of groups (one group per prompt)."""
    return [group_advantages(g, normalize=normalize) for g in groups]
