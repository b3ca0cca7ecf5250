"""reasoning-gym datasets as tasks: deterministic splits, held-out eval, their own scores."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tidal.common.config.loading import load_config
from tidal.common.errors import ConfigError
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.task_config import ReasoningGymTaskConfig
from tidal.orchestrator.tasks import Verdict, build_task

SMALL_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def test_problem_i_of_a_split_is_deterministic_and_eval_is_held_out() -> None:
    config = ReasoningGymTaskConfig(dataset="leg_counting", eval_size=20)
    task, again = build_task(config, seed=3), build_task(config, seed=3)
    train = [task.problem(i).prompt for i in range(40)]
    assert train == [again.problem(i).prompt for i in range(40)]
    evaluation = [task.problem(i, split="eval").prompt for i in range(20)]
    assert not set(train) & set(evaluation)
    assert (task.size("train"), task.size("eval")) == (None, 20)
    assert build_task(config, seed=4).problem(0).prompt != train[0]


def test_score_answer_gives_the_reward_and_sub_scores() -> None:
    task = build_task(ReasoningGymTaskConfig(dataset="leg_counting"), seed=0)
    problem = task.problem(5)
    assert problem.task == "leg_counting" and problem.metadata["total_legs"] == int(problem.answer)
    assert task.verify(problem, f" {problem.answer}\n") == Verdict(
        1.0, {"score": 1.0, "correct": 1.0}
    )
    wrong = str(int(problem.answer) + 1)
    assert task.verify(problem, wrong) == Verdict(0.0, {"score": 0.0, "correct": 0.0})


def test_options_reach_the_dataset_and_extract_pulls_the_tagged_answer() -> None:
    config = ReasoningGymTaskConfig(
        dataset="basic_arithmetic", options=SMALL_SUMS, extract="<answer>(.*?)</answer>"
    )
    task = build_task(config, seed=0)
    problem = task.problem(0)
    assert problem.metadata["num_terms"] == 2 and problem.messages[0]["role"] == "user"
    tagged = f"thinking... <answer>{problem.answer}</answer>"
    assert task.verify(problem, tagged).scores == {"score": 1.0, "correct": 1.0, "extracted": 1.0}
    assert task.verify(problem, problem.answer).scores["extracted"] == 0.0


def test_unknown_dataset_lists_the_registered_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown dataset 'leg_count'; registered: .*leg_counting"
    ):
        build_task(ReasoningGymTaskConfig(dataset="leg_count"))


def test_bad_options_name_the_dataset() -> None:
    with pytest.raises(ConfigError, match=r"reasoning_gym 'basic_arithmetic': options"):
        build_task(ReasoningGymTaskConfig(dataset="basic_arithmetic", options={"max_trems": 2}))


def test_seed_and_size_belong_to_the_task() -> None:
    with pytest.raises(ValidationError, match=r"options \['seed'\] are set by the task"):
        ReasoningGymTaskConfig(dataset="leg_counting", options={"seed": 1})


def test_config_union_accepts_reasoning_gym_from_the_command_line() -> None:
    argv = [
        "--task.type",
        "reasoning_gym",
        "--task.dataset",
        "leg_counting",
        "--task.eval-size",
        "8",
    ]
    config, _ = load_config(OrchestratorConfig, argv, environ={})
    assert isinstance(config.task, ReasoningGymTaskConfig) and config.task.eval_size == 8
