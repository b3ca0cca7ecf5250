"""An adaptive bound on concurrent Generate calls (additive increase, multiplicative decrease).

A burst (a step's prompts, the next step's, an evaluation) must not flood inference's
queue, which would only add latency. The bound halves while inference reports more than
`queue_target` queued requests or a KV cache fuller than `kv_usage_target` (the earlier
signal), and otherwise grows by one, between 1 and `max_inflight`. Reports are pushed by
the replicas as their figures change (peers/occupancy.py); the bound takes at most one
step per `adapt_s`, so its pace does not depend on how many replicas report how often.
"""

from __future__ import annotations

import asyncio
import time

ADAPT_S = 0.5
"""Shortest time between two steps of the bound."""


class InflightLimiter:
    def __init__(
        self,
        max_inflight: int,
        *,
        queue_target: int,
        kv_usage_target: float = 1.0,
        adapt_s: float = ADAPT_S,
    ) -> None:
        self.max_inflight = max_inflight
        self.queue_target = queue_target
        self.kv_usage_target = kv_usage_target
        self.adapt_s = adapt_s
        self.limit = max_inflight
        self.inflight = 0
        self._adapted_at = -float("inf")
        self._changed = asyncio.Condition()

    def adapt(self, queued: int, kv_usage: float = 0.0) -> None:
        """One step of the bound for a queue length and KV-cache usage at inference."""
        if queued > self.queue_target or kv_usage > self.kv_usage_target:
            self.limit = max(1, self.limit // 2)
        else:
            self.limit = min(self.max_inflight, self.limit + 1)

    async def observe(self, queued: int, kv_usage: float) -> None:
        """A pushed report (the longest queue, the fullest KV cache): step the bound if
        `adapt_s` has passed since its last step, and let waiters re-check."""
        now = time.monotonic()
        if now - self._adapted_at < self.adapt_s:
            return
        self._adapted_at = now
        self.adapt(queued, kv_usage)
        async with self._changed:
            self._changed.notify_all()

    async def __aenter__(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.inflight < self.limit)
            self.inflight += 1

    async def __aexit__(self, *exc_info: object) -> None:
        async with self._changed:
            self.inflight -= 1
            self._changed.notify_all()
