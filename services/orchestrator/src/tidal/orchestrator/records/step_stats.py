"""The open-ended metrics of one RL step, named with `/` prefixes for metrics.jsonl.

Kept apart from the loop so the loop reads as the pipeline and this as the bookkeeping:
per-task reward, pass rate and verifier sub-scores; advantage and length statistics;
the staleness histogram; samples dropped or cut and why; the two waits (trainer waiting
for a batch, generation waiting for a policy version); episodes' turns and tool calls;
what judges and reward models cost.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from tidal.orchestrator.completions import ScoredSample, ToolStats
from tidal.orchestrator.rollouts.generator import Generation, format_score
from tidal.orchestrator.staleness import version_staleness


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    v = np.asarray(values, dtype=np.float64)
    return {
        f"{prefix}/mean": float(v.mean()),
        f"{prefix}/std": float(v.std()),
        f"{prefix}/min": float(v.min()),
        f"{prefix}/max": float(v.max()),
    }


def per_task(scored: Sequence[ScoredSample], generation: Generation) -> dict[str, float]:
    out: dict[str, float] = {}
    rewards: dict[str, list[float]] = defaultdict(list)
    for s in scored:
        rewards[s.problem.task].append(s.reward)
    for task, values in sorted(rewards.items()):
        v = np.asarray(values)
        out[f"task/{task}/reward_mean"] = float(v.mean())
        out[f"task/{task}/reward_std"] = float(v.std())
        out[f"task/{task}/pass_rate"] = float((v >= 1.0).mean())
    scores: dict[str, list[float]] = defaultdict(list)
    for group in generation.groups:
        for outcome in group.outcomes:
            for name, value in outcome.scores.items():
                scores[f"task/{group.problem.task}/score/{name}"].append(value)
    out.update({name: float(np.mean(v)) for name, v in sorted(scores.items())})
    return out


def episode_stats(scored: Sequence[ScoredSample]) -> dict[str, float]:
    """Turns and tool calling of the step's multi-turn episodes (nothing without any):
    `tools/calls` etc. are the step's totals, `.../per_episode` their means;
    `episode/context_full` counts episodes the model's context ended, when any did."""
    episodes = [s.completion for s in scored if s.completion.turns]
    if not episodes:
        return {}
    total = sum((e.tools for e in episodes), ToolStats())
    out = {
        "episode/turns_mean": float(np.mean([len(e.turns) for e in episodes])),
        "episode/turns_max": float(max(len(e.turns) for e in episodes)),
        "tools/calls": float(total.calls),
        "tools/calls_per_episode": total.calls / len(episodes),
        "tools/parse_failures": float(total.parse_failures),
        "tools/errors": float(total.errors),
        "tools/seconds": total.seconds,
    }
    if total.calls:
        out["tools/parse_failure_rate"] = total.parse_failures / total.calls
    if context_full := sum(e.context_full for e in episodes):  # like verifier_failures/*
        out["episode/context_full"] = float(context_full)
    return out


def reasoning_stats(generation: Generation, *, parsed: bool) -> dict[str, float]:
    """Mean reasoning and answer characters per completion (an episode's turns summed) and
    the share of well-formed ones, over the step's kept groups (nothing when `parsed` is
    false: the run splits no reasoning)."""
    splits = [s for g in generation.groups for s in g.splits]
    if not parsed or not splits:
        return {}
    return {
        "reasoning/reasoning_chars_mean": float(
            np.mean([sum(len(t.reasoning) for t in s) for s in splits])
        ),
        "reasoning/answer_chars_mean": float(
            np.mean([sum(len(t.answer) for t in s) for s in splits])
        ),
        "reasoning/well_formed_fraction": float(np.mean([format_score(s) for s in splits])),
    }


def rl_step_extras(
    scored: Sequence[ScoredSample],
    kept: Sequence[ScoredSample],
    generation: Generation,
    *,
    step: int,
    truncated: int,
    dropped_overlong: int,
    trainer_wait_s: float,
    reasoning: bool = False,
) -> dict[str, float]:
    extras = per_task(scored, generation)
    extras.update(_stats("advantage", [s.advantage for s in kept]))
    lengths = [len(s.completion.token_ids) for s in scored]
    extras["completion_len/max"] = float(max(lengths, default=0))
    extras["completion_len/stopped_fraction"] = (
        float(np.mean([s.completion.stopped for s in scored])) if scored else 0.0
    )
    for age, count in sorted(Counter(s.staleness for s in kept).items()):
        extras[f"staleness/{age}"] = float(count)
    extras["staleness/max"] = float(max((s.staleness for s in kept), default=0))
    extras["staleness/gate"] = float(version_staleness(step, generation.loaded_version))
    extras["dropped/zero_variance_groups"] = float(generation.dropped_zero_variance)
    extras["dropped/overlong"] = float(dropped_overlong)
    extras["truncated"] = float(truncated)
    extras["sampling_rounds"] = float(generation.rounds)
    extras["prompts_drawn"] = float(len(generation.problems))
    for kind, count in sorted(generation.failures.items()):
        extras[f"verifier_failures/{kind}"] = float(count)
    extras.update(generation.counters)  # judge/*, reward_model/*
    extras.update(generation.curriculum)
    extras.update(episode_stats(scored))
    extras.update(reasoning_stats(generation, parsed=reasoning))
    extras["wait/trainer_s"] = trainer_wait_s
    extras["wait/policy_s"] = generation.policy_wait_seconds
    return extras
