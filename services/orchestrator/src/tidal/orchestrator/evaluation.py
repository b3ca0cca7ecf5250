"""Held-out evaluation: greedy accuracy and pass@k per task, on the current policy.

The held-out problems are the same at every evaluation (each task's eval split), so
evaluations over a run compare. Correct means reward 1.0; pass@k is the fraction of
problems with a correct completion among k samples at the training temperature. It runs
between steps, on whatever version inference has loaded then (`eval/policy_version`).
"""

from __future__ import annotations

import asyncio

import numpy as np

from tidal.orchestrator.config import EvalConfig
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.rollouts.generator import RolloutGenerator
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.tasks.base import Problem

EVAL_SEED_KEY = 99


def pass_at_k(rewards_per_problem: list[list[float]]) -> float:
    """Fraction of problems with at least one reward of 1.0."""
    if not rewards_per_problem:
        return 0.0
    return float(np.mean([any(r >= 1.0 for r in rs) for rs in rewards_per_problem]))


async def _eval_problem(
    generator: RolloutGenerator, problem: Problem, *, k: int, seed: int, tag: str
) -> tuple[float, list[float]]:
    """The greedy completion's reward and those of `k` samples (none when k is 0)."""
    prompt = generator.prompts.prompt_ids(problem)
    temperature = generator.config.sampling.temperature
    greedy = generator.rollouts(
        problem, prompt, n=1, temperature=0.0, seed=seed, request_id=tag + "-greedy"
    )
    if k == 0:
        greedy_outcomes, _ = await generator.score(problem, await greedy)
        return greedy_outcomes[0].reward, []
    greedy_rollouts, sampled = await asyncio.gather(
        greedy,
        generator.rollouts(
            problem, prompt, n=k, temperature=temperature, seed=seed, request_id=tag
        ),
    )
    greedy_outcomes, _ = await generator.score(problem, greedy_rollouts)
    sampled_outcomes, _ = await generator.score(problem, sampled)
    return greedy_outcomes[0].reward, [o.reward for o in sampled_outcomes]


async def evaluate(
    generator: RolloutGenerator, mixture: TaskMixture, config: EvalConfig, *, step: int
) -> dict[str, float]:
    """`eval/<task>/greedy_accuracy`, `.../greedy_reward` and, when `config.k` > 0,
    `.../pass@k` and `.../sampled_reward` (the mean reward of the k samples) for every
    task."""
    results: dict[str, float] = {}
    for name in mixture.names:
        problems = mixture.eval_problems(name, config.prompts)
        answers = await asyncio.gather(
            *(
                _eval_problem(
                    generator,
                    p,
                    k=config.k,
                    seed=derive_seed(generator.seed, EVAL_SEED_KEY, i),
                    tag=f"eval{step}-{name}-{i}",
                )
                for i, p in enumerate(problems)
            )
        )
        greedy = [g for g, _ in answers]
        results[f"eval/{name}/greedy_accuracy"] = float(np.mean([g >= 1.0 for g in greedy]))
        results[f"eval/{name}/greedy_reward"] = float(np.mean(greedy))
        if config.k:
            results[f"eval/{name}/pass@{config.k}"] = pass_at_k([s for _, s in answers])
            sampled = [r for _, s in answers for r in s]
            results[f"eval/{name}/sampled_reward"] = float(np.mean(sampled))
    return results
