"""A step's rollouts → the micro-batches of its Train call: staleness, over-long, packing.

Every completion (every sample of an agent episode) carries its group's advantage and its
staleness against the step; over-long samples are cut or dropped by
`packing.overlong_samples`, and what remains is packed for the trainer's data-parallel
ranks. Kept apart from the loop so the loop reads as the pipeline and this as the shaping
of one step's data; a step with no sample left to train is an error, never an empty Train.
"""

from __future__ import annotations

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import PackedMicroBatch, TrainSample, fit_to_budget
from tidal.orchestrator.completions import ScoredSample
from tidal.orchestrator.config import PackingConfig
from tidal.orchestrator.rollouts.generator import Generation
from tidal.orchestrator.staleness import AsyncWindow


def scored_samples(step: int, generation: Generation, window: AsyncWindow) -> list[ScoredSample]:
    """Every completion (every sample of an agent episode) with its group advantage and
    staleness."""
    scored = []
    for group in generation.groups:
        for i, (episode, outcome, advantage) in enumerate(
            zip(group.completions, group.outcomes, group.advantages, strict=True)
        ):
            for completion in episode.samples():
                age = window.staleness(
                    step, completion.policy_versions, fallback_version=generation.loaded_version
                )
                scored.append(
                    ScoredSample(
                        group.problem,
                        completion.prompt_ids or group.prompt_ids,
                        completion,
                        outcome.reward,
                        float(advantage),
                        age,
                        group.token_advantages(i) if completion is episode else (),
                    )
                )
    return scored


def fit_overlong(
    samples: list[TrainSample], packing: PackingConfig
) -> tuple[list[TrainSample], int, int]:
    """Apply the over-long rule: (samples, how many were truncated, how many dropped)."""
    budget = packing.micro_batch_tokens
    out, truncated, dropped = [], 0, 0
    for sample in samples:
        if sample.num_tokens <= budget:
            out.append(sample)
            continue
        fitted = fit_to_budget(sample, budget)
        if packing.overlong_samples == "drop" or fitted is None:
            dropped += 1
        else:
            out.append(fitted)
            truncated += 1
    if not out:
        raise RuntimeError(
            f"every sample of the step is longer than "
            f"orchestrator.packing.micro_batch_tokens={budget}"
        )
    return out, truncated, dropped


def pack_step(
    samples: list[TrainSample], packing: PackingConfig, data_parallel_ranks: int
) -> list[PackedMicroBatch]:
    """The step's micro-batches, balanced over the trainer's ranks (each labelled with its
    rank)."""
    per_rank = pack_for_ranks(
        samples,
        packing.micro_batch_tokens,
        data_parallel_ranks,
        share_prompts=packing.share_prompts,
    )
    return [b for rank in per_rank for b in rank]
