"""What a replica pushes on WatchOccupancy: changes, heartbeats, and an end at shutdown."""

from __future__ import annotations

import asyncio

import pytest

from tidal.common.errors import InvalidArgument
from tidal.inference.engine import EngineStatus
from tidal.inference.occupancy import OccupancyFigures, occupancy_reports, watch_intervals


def status(queued: int, kv_usage: float) -> EngineStatus:
    return EngineStatus(
        policy_version=0,
        running=1,
        queued=queued,
        generated_tokens=0,
        tokens_per_s=0.0,
        model="m",
        vocab_size=8,
        max_seq_len=16,
        kv_usage=kv_usage,
    )


async def test_changes_are_pushed_unchanged_figures_only_as_heartbeats_and_shutdown_ends_it() -> (
    None
):
    current = status(0, 0.0)
    closing = asyncio.Event()
    reports = occupancy_reports(
        lambda: current, min_interval_s=0.01, heartbeat_s=0.2, closing=closing
    )
    first = await anext(reports)
    assert first == OccupancyFigures.of(current)  # at once
    current = status(3, 0.5)
    assert (await anext(reports)).queued == 3  # the change, within an interval
    started = asyncio.get_running_loop().time()
    again = await anext(reports)  # nothing changed: the heartbeat repeats it
    assert again.queued == 3 and asyncio.get_running_loop().time() - started >= 0.15
    closing.set()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(reports), 1.0)


def test_intervals_default_and_refuse_values_out_of_range_by_name() -> None:
    assert watch_intervals(0, 0) == (0.1, 1.0)
    assert watch_intervals(5000, 0) == (5.0, 5.0)  # the heartbeat is never below the interval
    for interval, heartbeat, field in [
        (-1, 0, "min_interval_ms"),
        (9, 0, "min_interval_ms"),
        (10_001, 0, "min_interval_ms"),
        (100, 99, "heartbeat_ms"),
        (100, 60_001, "heartbeat_ms"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            watch_intervals(interval, heartbeat)
        assert err.value.field == field
