"""A task with a model reward is scored by it, never by its verifier, with the same reward
shaping; what scoring cost reaches the step's metrics as summed counters, and Prometheus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tidal.common.observability.prometheus import ServiceMetrics
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ChatConfig, OrchestratorConfig
from tidal.orchestrator.records.prometheus import OrchestratorMetrics
from tidal.orchestrator.records.run_log import StepRecord
from tidal.orchestrator.records.step_stats import rl_step_extras
from tidal.orchestrator.rollouts.generator import Generation, RolloutGenerator
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.scoring.scorers import build_scorers
from tidal.orchestrator.scoring.verifier_pool import VerifyOutcome
from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks import Problem, build_task
from tidal.text.byte import ByteTokenizer


class LengthReward:
    """A model reward that scores by length, recording what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str | list[str]] = []

    async def score(
        self, problem: Problem, completions: Sequence[str | list[str]]
    ) -> list[VerifyOutcome]:
        self.asked += completions
        return [
            VerifyOutcome(min(1.0, len(c) / 4), counters={"judge/calls": 1.0}) for c in completions
        ]

    async def wait_ready(self, timeout_s: float) -> None: ...

    async def close(self) -> None: ...


def _completion(tokenizer: ByteTokenizer, text: str) -> Completion:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False))
    return Completion(0, ids, (0.0,) * len(ids), (0,) * len(ids), True)


async def test_the_model_reward_scores_its_task_instead_of_the_verifier() -> None:
    tokenizer = ByteTokenizer()
    reward = LengthReward()
    generator = RolloutGenerator(
        OrchestratorConfig(),
        seed=0,
        inference=None,  # type: ignore[arg-type]
        limiter=None,  # type: ignore[arg-type]
        prompts=PromptRenderer.from_config(tokenizer, ChatConfig()),
        max_tokens=8,
        tasks={},
        scorers=build_scorers(
            {"reversal": build_task(ReversalTaskConfig())},
            None,  # type: ignore[arg-type]  # a verifier call would fail
            {"reversal": reward},
        ),
    )
    problem = Problem("abc>", "cba", task="reversal")
    outcomes, shaped = await generator.score(
        problem, [_completion(tokenizer, "cb"), _completion(tokenizer, "cbaa")]
    )
    assert reward.asked == ["cb", "cbaa"]
    assert [o.reward for o in outcomes] == shaped == [0.5, 1.0]


def test_counters_reach_the_steps_metrics() -> None:
    generation = Generation(
        groups=[],
        problems=[],
        mixture_before={},
        mixture_after={},
        loaded_version=0,
        seconds=1.0,
        policy_wait_seconds=0.0,
        counters={"judge/calls": 3.0, "judge/cache_hits": 5.0},
    )
    extras = rl_step_extras(
        [], [], generation, step=1, truncated=0, dropped_overlong=0, trainer_wait_s=0.0
    )
    assert (extras["judge/calls"], extras["judge/cache_hits"]) == (3.0, 5.0)


def test_prometheus_counts_judge_and_reward_model_costs_across_steps() -> None:
    metrics = ServiceMetrics("orchestrator")
    prom = OrchestratorMetrics(metrics)
    extra = {"judge/calls": 3.0, "judge/timeouts": 1.0, "reward_model/inputs": 4.0}
    for step in (1, 2):
        prom.step_finished(replace(StepRecord.lost(step), phase="rl", extra=extra))
    value = metrics.registry.get_sample_value
    assert value("tidal_orchestrator_judge_calls_total") == 6
    assert value("tidal_orchestrator_judge_timeouts_total") == 2
    assert value("tidal_orchestrator_judge_cache_hits_total") == 0
    assert value("tidal_orchestrator_reward_model_inputs_total") == 8
