"""The async window: which version a step waits for, how far generation runs ahead,
how stale a sample is, which samples are dropped, and waiting for a loaded version."""

from __future__ import annotations

import asyncio

import pytest

from tidal.orchestrator.completions import Completion, ScoredSample
from tidal.orchestrator.config import StalenessConfig
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.orchestrator.staleness import AsyncWindow, PolicyVersionTimeout, sample_staleness
from tidal.orchestrator.tasks.base import Problem
from tidal.weights.manifest import LoadedVersions


class OneReplica:
    """The window's source over a real VersionFeed that one replica's pushes update."""

    def __init__(self, version: int) -> None:
        self.feed = VersionFeed()
        self.push(version)

    def push(self, version: int) -> None:
        self.feed.apply(LoadedVersions(version, {"replica": version}))

    def loaded_version(self) -> int:
        return self.feed.loaded("replica")

    async def wait_loaded(self, version: int) -> int:
        await self.feed.wait_until(lambda: self.loaded_version() >= version)
        return self.loaded_version()


def _window(
    max_async: int, loaded: int = 0, bound: int | None = None, wait_s: float = 5.0
) -> AsyncWindow:
    config = StalenessConfig(max_async=max_async, max_off_policy_steps=bound)
    return AsyncWindow(config, OneReplica(loaded), wait_timeout_s=wait_s)


def _sample(versions: tuple[int, ...], step: int) -> ScoredSample:
    completion = Completion(0, (1,) * len(versions), (-1.0,) * len(versions), versions, True)
    age = sample_staleness(step, versions, fallback_version=-1)
    return ScoredSample(Problem("ab>", "ba"), (256,), completion, 1.0, 0.0, age)


@pytest.mark.parametrize(
    ("max_async", "needed"),
    [
        (0, {1: 0, 2: 1, 3: 2, 10: 9}),  # on-policy: step n waits for version n-1
        (1, {1: 0, 2: 0, 3: 1, 10: 8}),
        (2, {1: 0, 2: 0, 3: 0, 4: 1, 10: 7}),
    ],
)
def test_a_step_needs_version_step_minus_one_minus_max_async_never_below_zero(
    max_async: int, needed: dict[int, int]
) -> None:
    window = _window(max_async)
    assert {step: window.needed_version(step) for step in needed} == needed


@pytest.mark.parametrize(("max_async", "last"), [(0, 6), (1, 7), (2, 8)])
def test_generation_may_start_up_to_max_async_steps_past_the_next_one(
    max_async: int, last: int
) -> None:
    # step 5 trained: step 6 is next; max_async more may generate ahead of it
    assert _window(max_async).last_startable_step(5) == last


def test_the_window_edges_agree_a_startable_step_needs_a_trained_version() -> None:
    for max_async in (0, 1, 2):
        window = _window(max_async)
        for trained in range(0, 6):
            last = window.last_startable_step(trained)
            assert window.needed_version(last) <= trained
            assert window.needed_version(last + 1) == trained + 1


def test_on_policy_sample_has_staleness_zero() -> None:
    # step n trains version n-1 into version n
    assert sample_staleness(5, [4, 4, 4], fallback_version=0) == 0


def test_oldest_token_version_counts() -> None:
    assert sample_staleness(5, [2, 3, 4], fallback_version=0) == 2


def test_empty_completion_uses_the_fallback_version() -> None:
    assert sample_staleness(5, [], fallback_version=3) == 1


def test_default_bound_is_max_async_plus_one() -> None:
    assert StalenessConfig(max_async=0).bound == 1
    assert StalenessConfig(max_async=2).bound == 3
    assert _window(2).bound == 3


def test_max_off_policy_steps_overrides_the_bound() -> None:
    assert StalenessConfig(max_async=2, max_off_policy_steps=0).bound == 0
    assert _window(1, bound=4).bound == 4


def test_samples_past_the_bound_are_dropped_and_counted() -> None:
    samples = [_sample((9,), 10), _sample((8, 9), 10), _sample((7,), 10), _sample((5,), 10)]
    kept, dropped = _window(0).drop_stale(samples)  # bound 1
    assert [s.staleness for s in kept] == [0, 1]
    assert dropped == 2


def test_an_overridden_bound_of_zero_keeps_only_on_policy_samples() -> None:
    samples = [_sample((9,), 10), _sample((8, 9), 10)]
    kept, dropped = _window(2, bound=0).drop_stale(samples)
    assert [s.staleness for s in kept] == [0] and dropped == 1


async def test_waiting_for_a_loaded_version_returns_at_once_when_it_is_there() -> None:
    window = _window(1, 3)
    assert await window.wait_for_step(4) == 3  # step 4 needs version 2; 3 is loaded
    assert window.loaded == 3


async def test_waiting_wakes_when_the_needed_version_is_pushed() -> None:
    inference = OneReplica(1)
    window = AsyncWindow(StalenessConfig(max_async=0), inference, wait_timeout_s=5.0)
    waiting = asyncio.create_task(window.wait_for_step(4))  # version 3 needed
    for version in (1, 2):
        inference.push(version)
        await asyncio.sleep(0)
        assert not waiting.done()
    inference.push(3)
    assert await asyncio.wait_for(waiting, 5) == 3


async def test_a_version_never_loaded_times_out_naming_both_versions() -> None:
    window = _window(0, 1, wait_s=0.05)
    with pytest.raises(PolicyVersionTimeout, match=r"serves version 1 .* version 5 is needed"):
        await window.wait_for_step(6)


async def test_a_version_seen_loaded_is_not_waited_for_again() -> None:
    inference = OneReplica(2)
    window = AsyncWindow(StalenessConfig(max_async=0), inference, wait_timeout_s=5.0)
    await window.wait_loaded(2)
    inference.feed = VersionFeed()  # the pool forgot it (a replaced replica): none known
    assert await asyncio.wait_for(window.wait_loaded(1), 1) == 2


async def test_a_wait_asks_whether_the_version_can_still_come_and_ends_when_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`stalled` is asked about once per STALLED_CHECK_S while the version is awaited; its
    error (the trainer's full disk) ends the wait instead of the timeout."""
    monkeypatch.setattr("tidal.orchestrator.staleness.STALLED_CHECK_S", 0.01)
    asked = 0

    async def stalled() -> None:
        nonlocal asked
        asked += 1
        if asked == 3:
            raise RuntimeError("disk full: the version will not come")

    window = AsyncWindow(
        StalenessConfig(max_async=0), OneReplica(1), wait_timeout_s=30.0, stalled=stalled
    )
    with pytest.raises(RuntimeError, match="disk full"):
        await asyncio.wait_for(window.wait_for_step(4), 5)
    assert asked == 3


async def test_a_wait_that_is_not_stalled_still_wakes_on_a_push_and_still_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tidal.orchestrator.staleness.STALLED_CHECK_S", 0.01)
    asked: list[int] = []

    async def stalled() -> None:
        asked.append(1)

    inference = OneReplica(1)
    window = AsyncWindow(
        StalenessConfig(max_async=0), inference, wait_timeout_s=30.0, stalled=stalled
    )
    waiting = asyncio.create_task(window.wait_for_step(3))  # version 2 needed
    await asyncio.sleep(0.05)
    assert not waiting.done() and asked
    inference.push(2)
    assert await asyncio.wait_for(waiting, 5) == 2
    window.wait_timeout_s = 0.05
    with pytest.raises(PolicyVersionTimeout, match="version 5 is needed"):
        await window.wait_for_step(6)
