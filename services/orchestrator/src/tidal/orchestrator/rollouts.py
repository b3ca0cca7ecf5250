"""Rollouts as the orchestrator sees them, and the staleness rule that filters them.

Decisions:
- Staleness of a sample trained at step n is `(n - 1) - min(policy_versions)`: how many
  optimizer steps the oldest policy that wrote any of its tokens lags behind the policy
  being updated (version n - 1). On-policy samples have staleness 0; with `max_async = k`
  the gate in the loop keeps it ≤ k unless inference is late to load a version.
- The oldest token's version counts, not the newest: a completion that spans a reload is
  only as fresh as its stalest part.
- Samples over the bound are dropped after advantages are computed, so the surviving
  samples keep the baseline of their whole group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidal.orchestrator.tasks.base import Problem


@dataclass(frozen=True)
class Completion:
    """One completion returned by inference."""

    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_versions: tuple[int, ...]
    stopped: bool
    """True when a stop token ended it; False when max_tokens or the context cut it."""
    loss_mask: tuple[float, ...] = ()
    """Multi-turn: 1 for model tokens, 0 for environment tokens (empty: all model tokens).
    `logprobs` are 0 at environment tokens; `policy_versions` list model tokens only."""
    turns: tuple[str, ...] = ()
    """Multi-turn: the decoded model turns (empty for single-turn completions)."""


@dataclass(frozen=True)
class ScoredSample:
    """A verified completion with its advantage and staleness, ready to pack."""

    problem: Problem
    prompt_ids: tuple[int, ...]
    completion: Completion
    reward: float
    advantage: float
    staleness: int


def staleness(step: int, policy_versions: Sequence[int], *, fallback_version: int) -> int:
    """`(step - 1) - oldest version`; a completion with no tokens uses `fallback_version`."""
    oldest = min(policy_versions, default=fallback_version)
    return (step - 1) - oldest


def drop_stale(
    samples: Sequence[ScoredSample], max_off_policy_steps: int
) -> tuple[list[ScoredSample], int]:
    """Samples within the staleness bound, and how many were dropped."""
    kept = [s for s in samples if s.staleness <= max_off_policy_steps]
    return kept, len(samples) - len(kept)
