"""A task's scorer, chosen once when the run is built, and the model rewards it may use.

A verifiers environment's episodes carry their own reward; a task whose config has a
`reward` is scored by that judge or reward model; any other by its verifier in the pool.
Model rewards are built at start so a bad one fails before any step, and tasks with equal
reward configs share one judge (and its cache) or one reward-model worker.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tidal.common.errors import ConfigError
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.rollouts.verifiers_env import VerifiersTask
from tidal.orchestrator.scoring.judge import Judge
from tidal.orchestrator.scoring.model_reward_config import JudgeRewardConfig, RewardConfig
from tidal.orchestrator.scoring.reward_model import RewardModel
from tidal.orchestrator.scoring.verifier_pool import VerifierPool, VerifyOutcome
from tidal.orchestrator.tasks.agent import AgentTask
from tidal.orchestrator.tasks.base import Problem, Task

Answers = Sequence[str | list[str]]
"""Each completion's answer: its text, or an episode's model turns."""
Scorer = Callable[[Problem, Sequence[Completion], Answers], Awaitable[list[VerifyOutcome]]]
"""`scorer(problem, completions, answers)`: one outcome per completion, in order."""


class ModelReward(Protocol):
    async def score(self, problem: Problem, completions: Answers) -> list[VerifyOutcome]:
        """One outcome per completion, in order."""

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once it can score (a judge's endpoint answers); ConfigError if never."""

    async def close(self) -> None: ...


def build_model_rewards(
    task_configs: Sequence[Any], names: Sequence[str], environ: Mapping[str, str] | None = None
) -> dict[str, ModelReward]:
    """Task name → its model reward, for the tasks (configs, in the order of `names`) that
    have one. Forks reward-model workers: call it before the service starts gRPC."""
    environ = os.environ if environ is None else environ
    shared: dict[str, ModelReward] = {}
    out: dict[str, ModelReward] = {}
    for config, name in zip(task_configs, names, strict=True):
        reward: RewardConfig | None = getattr(config, "reward", None)
        if reward is None:
            continue
        key = reward.model_dump_json()
        if key not in shared:
            shared[key] = _build(reward, name, environ)
        out[name] = shared[key]
    return out


def _build(reward: RewardConfig, task: str, environ: Mapping[str, str]) -> ModelReward:
    where = f"orchestrator task {task}: reward"
    if isinstance(reward, JudgeRewardConfig):
        if reward.base_url is None:
            raise ConfigError(
                f"{where}: the judge's model_path {reward.model_path} is served by `tidal rl`; "
                "running the orchestrator alone, set base_url to the endpoint serving it"
            )
        api_key = None
        if reward.api_key_env is not None:
            api_key = environ.get(reward.api_key_env)
            if not api_key:
                raise ConfigError(
                    f"{where}: api_key_env names {reward.api_key_env}, which is not set"
                )
        return Judge(reward, api_key=api_key)
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError(
            f"{where}: a reward model needs transformers and torch: "
            "pip install 'tidal-orchestrator[reward-model]'"
        )
    if not (reward.path / "config.json").is_file():
        raise ConfigError(f"{where}: {reward.path} is not a model folder (no config.json)")
    return RewardModel(reward)


async def environment_reward(
    problem: Problem, completions: Sequence[Completion], answers: Answers
) -> list[VerifyOutcome]:
    """The reward an environment gave each of its episodes (`Completion.reward`)."""
    return [VerifyOutcome(float(c.reward or 0.0)) for c in completions]


@dataclass(frozen=True)
class ByAnswer:
    """Scores each completion's answer: by the task's verifier (the pool) or model reward."""

    reward: VerifierPool | ModelReward

    async def __call__(
        self, problem: Problem, completions: Sequence[Completion], answers: Answers
    ) -> list[VerifyOutcome]:
        return await self.reward.score(problem, answers)


def build_scorers(
    tasks: Mapping[str, Task], verifier: VerifierPool, model_rewards: Mapping[str, ModelReward]
) -> dict[str, Scorer]:
    """Task name → its scorer: the environment's own reward (a verifiers environment, an
    agent that posts its reward), its model reward, or its verifier."""
    return {
        name: environment_reward
        if isinstance(task, VerifiersTask)
        or (isinstance(task, AgentTask) and task.config.self_reward)
        else ByAnswer(model_rewards.get(name, verifier))
        for name, task in tasks.items()
    }
