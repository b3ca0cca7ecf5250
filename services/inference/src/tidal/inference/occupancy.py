"""What a replica pushes to its watchers: queue depth and KV-cache use (WatchOccupancy).

The figures are read from the engine in-process every `min_interval_s` and sent only when
they changed, or unchanged once `heartbeat_s` has passed since the last report, so an idle
replica costs its watchers one small message per heartbeat and a busy one at most one per
interval. The request's bounds are checked here, naming the field, before anything runs.
A stream ends when the server shuts down, so it never holds the shutdown's grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tidal.common.errors import InvalidArgument
from tidal.inference.engine import EngineStatus

DEFAULT_MIN_INTERVAL_MS = 100
DEFAULT_HEARTBEAT_MS = 1000
MIN_INTERVAL_RANGE_MS = (10, 10_000)
MAX_HEARTBEAT_MS = 60_000


@dataclass(frozen=True)
class OccupancyFigures:
    queued: int
    """Requests waiting for a batch."""
    running: int
    """Sequences being decoded or prefilled."""
    kv_slots_used: int
    kv_slots_total: int
    kv_usage: float
    """Fraction of the KV cache's blocks held by running sequences."""

    @classmethod
    def of(cls, status: EngineStatus) -> OccupancyFigures:
        return cls(
            queued=status.queued,
            running=status.running,
            kv_slots_used=status.kv_slots_used,
            kv_slots_total=status.kv_slots_total,
            kv_usage=status.kv_usage,
        )


def watch_intervals(min_interval_ms: int, heartbeat_ms: int) -> tuple[float, float]:
    """(min interval, heartbeat) in seconds from a request's fields (0: the default)."""
    interval = min_interval_ms or DEFAULT_MIN_INTERVAL_MS
    low, high = MIN_INTERVAL_RANGE_MS
    if not low <= interval <= high:
        raise InvalidArgument("min_interval_ms", f"{min_interval_ms} is not in [{low}, {high}]")
    heartbeat = heartbeat_ms or max(DEFAULT_HEARTBEAT_MS, interval)
    if not interval <= heartbeat <= MAX_HEARTBEAT_MS:
        raise InvalidArgument(
            "heartbeat_ms",
            f"{heartbeat_ms} is not in [min_interval_ms ({interval}), {MAX_HEARTBEAT_MS}]",
        )
    return interval / 1000, heartbeat / 1000


async def occupancy_reports(
    status: Callable[[], EngineStatus],
    *,
    min_interval_s: float,
    heartbeat_s: float,
    closing: asyncio.Event,
) -> AsyncIterator[OccupancyFigures]:
    """The current figures, then each change (checked every `min_interval_s`) and the
    unchanged figures again after `heartbeat_s` without a report; ends once `closing` is
    set."""
    last: OccupancyFigures | None = None
    sent_at = 0.0
    while not closing.is_set():
        figures = OccupancyFigures.of(status())
        now = time.monotonic()
        if figures != last or now - sent_at >= heartbeat_s:
            last, sent_at = figures, now
            yield figures
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), min_interval_s)
