"""The model rewards of a run's tasks, built at start so a bad one fails before any step.

A task whose config has a `reward` is scored by it instead of its verifier. Tasks with
equal reward configs share one judge (and its cache) or one reward-model worker. Every
check that needs no peer happens here: a judge's URL and API key variable, a reward
model's folder and the `reward-model` extra, the model's labels (the worker loads it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.judge import Judge
from tidal.orchestrator.scoring.model_reward_config import JudgeRewardConfig, RewardConfig
from tidal.orchestrator.scoring.reward_model import RewardModel
from tidal.orchestrator.scoring.verifier_pool import VerifyOutcome
from tidal.orchestrator.tasks.base import Problem


class ModelReward(Protocol):
    async def score(
        self, problem: Problem, completions: Sequence[str | list[str]]
    ) -> list[VerifyOutcome]:
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
