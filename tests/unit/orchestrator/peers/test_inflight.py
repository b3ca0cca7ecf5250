"""The adaptive in-flight bound: halves under queue pressure, grows back by one, at a set pace."""

from __future__ import annotations

import asyncio

from tidal.orchestrator.peers.inflight import InflightLimiter


def test_limit_halves_above_the_queue_target_and_recovers_additively() -> None:
    limiter = InflightLimiter(16, queue_target=4)
    limiter.adapt(10)
    limiter.adapt(10)
    assert limiter.limit == 4
    for _ in range(3):
        limiter.adapt(0)
    assert limiter.limit == 7
    for _ in range(100):
        limiter.adapt(0)
    assert limiter.limit == 16
    for _ in range(10):
        limiter.adapt(99)
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
    limiter.adapt(0, kv_usage=0.95)
    assert limiter.limit == 8
    limiter.adapt(0, kv_usage=0.5)
    assert limiter.limit == 9


async def test_pushed_reports_step_the_bound_at_most_once_per_adapt_s() -> None:
    limiter = InflightLimiter(16, queue_target=4, adapt_s=60.0)
    for _ in range(5):  # a burst of reports from several replicas: one step
        await limiter.observe(10, 0.0)
    assert limiter.limit == 8
    fast = InflightLimiter(16, queue_target=4, adapt_s=0.0)
    for _ in range(3):
        await fast.observe(10, 0.0)
    assert fast.limit == 2
