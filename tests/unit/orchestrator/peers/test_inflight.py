"""The adaptive in-flight bound: halves under queue pressure, grows back by one."""

from __future__ import annotations

import asyncio

from tidal.orchestrator.peers.inflight import InflightLimiter


def test_limit_halves_above_the_queue_target_and_recovers_additively() -> None:
    limiter = InflightLimiter(16, queue_target=4)
    limiter.observe_queue(10)
    limiter.observe_queue(10)
    assert limiter.limit == 4
    for _ in range(3):
        limiter.observe_queue(0)
    assert limiter.limit == 7
    for _ in range(100):
        limiter.observe_queue(0)
    assert limiter.limit == 16
    for _ in range(10):
        limiter.observe_queue(99)
    assert limiter.limit == 1


async def test_no_more_than_the_limit_run_at_once() -> None:
    limiter = InflightLimiter(3, queue_target=0)
    running = peak = 0

    async def work() -> None:
        nonlocal running, peak
        async with limiter:
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    await asyncio.gather(*(work() for _ in range(20)))
    assert peak == 3 and limiter.inflight == 0


def test_a_full_kv_cache_halves_the_limit_even_without_a_queue() -> None:
    limiter = InflightLimiter(16, queue_target=4, kv_usage_target=0.9)
    limiter.observe_queue(0, kv_usage=0.95)
    assert limiter.limit == 8
    limiter.observe_queue(0, kv_usage=0.5)
    assert limiter.limit == 9
