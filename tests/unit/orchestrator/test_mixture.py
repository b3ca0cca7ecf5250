"""The task mixture: weighted task choice, cursors, and a state that resumes exactly."""

from __future__ import annotations

from collections import Counter

import pytest

from tidal.common.errors import ConfigError
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.task_config import ArithmeticTaskConfig, ReversalTaskConfig
from tidal.orchestrator.tasks import build_tasks


def _mixture(seed: int = 0, weights: tuple[float, float] = (3.0, 1.0)) -> TaskMixture:
    tasks = build_tasks([ReversalTaskConfig(), ArithmeticTaskConfig()], seed=seed)
    return TaskMixture(tasks, list(weights), seed=seed)


def test_tasks_are_drawn_by_weight() -> None:
    counts = Counter(p.task for p in _mixture().draw(4000))
    assert counts["reversal"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_each_task_advances_its_own_cursor_without_repeats() -> None:
    mixture = _mixture()
    problems = mixture.draw(100)
    uids = [p.uid for p in problems]
    assert len(set(uids)) == 100
    assert mixture.cursors == dict(Counter(p.task for p in problems))


def test_restored_state_draws_what_the_uninterrupted_mixture_draws() -> None:
    uninterrupted = _mixture(seed=5)
    first = uninterrupted.draw(30)
    expected = uninterrupted.draw(30)

    interrupted = _mixture(seed=5)
    assert interrupted.draw(30) == first
    saved = interrupted.state_dict()
    resumed = _mixture(seed=5)  # a new process
    resumed.load_state_dict(saved)
    assert resumed.draw(30) == expected


def test_state_of_other_tasks_is_rejected() -> None:
    state = _mixture().state_dict()
    only = TaskMixture(build_tasks([ReversalTaskConfig()], seed=0), [1.0], seed=0)
    with pytest.raises(ConfigError, match="saved progress has tasks"):
        only.load_state_dict(state)


def test_eval_problems_are_fixed_and_distinct_from_training() -> None:
    mixture = _mixture()
    evals = mixture.eval_problems("arithmetic", 5)
    assert evals == mixture.eval_problems("arithmetic", 5)
    assert all(p.uid.startswith("arithmetic/eval/") for p in evals)
