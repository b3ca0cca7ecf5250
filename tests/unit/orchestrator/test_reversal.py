"""The built-in reversal task: prompts, references and the partial-credit verifier."""

from __future__ import annotations

import random

import pytest

from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.tasks.reversal import reversal_reward


def test_exact_answer_scores_one() -> None:
    assert reversal_reward("cba", "cba") == 1.0


def test_partial_answer_scores_fraction_of_matching_positions() -> None:
    assert reversal_reward("cbx", "cba") == pytest.approx(2 / 3)
    assert reversal_reward("xbx", "cba") == pytest.approx(1 / 3)


def test_empty_answer_scores_zero() -> None:
    assert reversal_reward("", "cba") == 0.0


def test_overlong_answer_is_divided_by_its_own_length() -> None:
    assert reversal_reward("cbaaaa", "cba") == pytest.approx(3 / 6)


def test_short_answer_is_divided_by_the_target_length() -> None:
    assert reversal_reward("cb", "cba") == pytest.approx(2 / 3)


def test_sampled_problems_reverse_their_prompt_and_respect_the_config() -> None:
    task = build_task(ReversalTaskConfig(alphabet="xyz", min_len=2, max_len=4))
    problems = task.sample_many(random.Random(0), 200)
    for problem in problems:
        text, sep = problem.prompt[:-1], problem.prompt[-1]
        assert sep == ">"
        assert problem.reference == text[::-1]
        assert 2 <= len(text) <= 4 and set(text) <= set("xyz")
        assert task.verify(problem, problem.reference) == 1.0
    assert {len(p.reference) for p in problems} == {2, 3, 4}
    assert task.max_completion_chars == 4


def test_sampling_is_reproducible_from_the_seed() -> None:
    task = build_task(ReversalTaskConfig())
    assert task.sample_many(random.Random(7), 10) == task.sample_many(random.Random(7), 10)


def test_config_rejects_min_len_above_max_len() -> None:
    with pytest.raises(ValueError, match="min_len"):
        ReversalTaskConfig(min_len=5, max_len=3)


def test_without_partial_credit_only_the_exact_reversal_scores() -> None:
    task = build_task(ReversalTaskConfig(min_len=3, max_len=3, partial_credit=False), seed=0)
    problem = task.problem(0)
    assert task.verify(problem, problem.reference) == 1.0
    assert task.verify(problem, problem.reference[:2] + "x") == 0.0
