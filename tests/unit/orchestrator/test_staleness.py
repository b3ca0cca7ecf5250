"""Staleness of rollouts and the filter that drops samples past the bound."""

from __future__ import annotations

from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.rollouts import Completion, ScoredSample, drop_stale, staleness
from tidal.orchestrator.tasks.base import Problem


def _sample(versions: tuple[int, ...], step: int) -> ScoredSample:
    completion = Completion(0, (1,) * len(versions), (-1.0,) * len(versions), versions, True)
    age = staleness(step, versions, fallback_version=-1)
    return ScoredSample(Problem("ab>", "ba"), (256,), completion, 1.0, 0.0, age)


def test_on_policy_sample_has_staleness_zero() -> None:
    # step n trains version n-1 into version n
    assert staleness(5, [4, 4, 4], fallback_version=0) == 0


def test_oldest_token_version_counts() -> None:
    assert staleness(5, [2, 3, 4], fallback_version=0) == 2


def test_empty_completion_uses_the_fallback_version() -> None:
    assert staleness(5, [], fallback_version=3) == 1


def test_samples_past_the_bound_are_dropped_and_counted() -> None:
    samples = [_sample((9,), 10), _sample((8, 9), 10), _sample((7,), 10), _sample((5,), 10)]
    kept, dropped = drop_stale(samples, max_off_policy_steps=1)
    assert [s.staleness for s in kept] == [0, 1]
    assert dropped == 2


def test_default_bound_is_max_async_plus_one() -> None:
    assert OrchestratorConfig(max_async=2).staleness_bound == 3
    assert OrchestratorConfig(max_async=2, max_off_policy_steps=0).staleness_bound == 0
