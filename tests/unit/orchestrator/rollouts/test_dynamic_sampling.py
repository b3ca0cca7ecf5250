"""Dynamic sampling fills the batch with groups that carry signal, in bounded rounds."""

from __future__ import annotations

from tidal.orchestrator.advantages import has_signal
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.rollouts.dynamic_sampling import fill_batch
from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks import Problem, build_tasks


def _mixture() -> TaskMixture:
    return TaskMixture(build_tasks([ReversalTaskConfig()], seed=0), [1.0], seed=0)


def _rewards_for(problem: Problem) -> list[float]:
    """A group's rewards: every third prompt (by cursor) has signal, the rest are flat."""
    index = int(problem.uid.rsplit("/", 1)[1])
    return [0.0, 1.0, 0.5] if index % 3 == 0 else [0.5, 0.5, 0.5]


async def _generate(round_: int, problems: list[Problem]) -> list[list[float]]:
    return [_rewards_for(p) for p in problems]


async def test_dynamic_sampling_fills_the_batch_with_signal_groups() -> None:
    mixture = _mixture()
    batch = await fill_batch(
        8, draw=mixture.draw, generate=_generate, keep=has_signal, max_rounds=20
    )
    assert len(batch.kept) == 8
    assert all(has_signal(g) for g in batch.kept)
    assert batch.dropped == len(batch.drawn) - 8  # every other prompt is dropped and counted
    assert batch.rounds > 1
    assert mixture.cursors["reversal"] == len(batch.drawn)


async def test_without_dynamic_sampling_one_round_keeps_everything() -> None:
    mixture = _mixture()
    batch = await fill_batch(8, draw=mixture.draw, generate=_generate, keep=None, max_rounds=20)
    assert (len(batch.kept), batch.rounds, batch.dropped, len(batch.drawn)) == (8, 1, 0, 8)


async def test_round_limit_trains_a_partial_batch() -> None:
    mixture = _mixture()
    batch = await fill_batch(
        8, draw=mixture.draw, generate=_generate, keep=has_signal, max_rounds=1
    )
    assert batch.rounds == 1 and len(batch.kept) == 3  # cursors 0, 3, 6 of 0..7


async def test_no_signal_at_all_keeps_the_last_round() -> None:
    async def flat(round_: int, problems: list[Problem]) -> list[list[float]]:
        return [[0.2, 0.2] for _ in problems]

    batch = await fill_batch(4, draw=_mixture().draw, generate=flat, keep=has_signal, max_rounds=3)
    assert batch.rounds == 3 and batch.dropped == 12 and len(batch.kept) == 4
