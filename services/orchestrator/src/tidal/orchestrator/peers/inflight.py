"""An adaptive bound on concurrent Generate calls (additive increase, multiplicative decrease).

A burst (a step's prompts, the next step's, an evaluation) must not flood inference's
queue, which would only add latency. The bound halves while inference reports more than
`queue_target` queued requests or a KV cache fuller than `kv_usage_target` (the earlier
signal), and otherwise grows by one, between 1 and `max_inflight`.
"""

from __future__ import annotations

import asyncio


class InflightLimiter:
    def __init__(
        self, max_inflight: int, *, queue_target: int, kv_usage_target: float = 1.0
    ) -> None:
        self.max_inflight = max_inflight
        self.queue_target = queue_target
        self.kv_usage_target = kv_usage_target
        self.limit = max_inflight
        self.inflight = 0
        self._changed = asyncio.Condition()

    def observe_queue(self, queued: int, kv_usage: float = 0.0) -> None:
        """Adapt the bound to inference's reported queue length and KV-cache usage."""
        if queued > self.queue_target or kv_usage > self.kv_usage_target:
            self.limit = max(1, self.limit // 2)
        else:
            self.limit = min(self.max_inflight, self.limit + 1)

    async def __aenter__(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.inflight < self.limit)
            self.inflight += 1

    async def __aexit__(self, *exc_info: object) -> None:
        async with self._changed:
            self.inflight -= 1
            self._changed.notify_all()

    async def wake(self) -> None:
        """Let waiters re-check after the limit grew."""
        async with self._changed:
            self._changed.notify_all()
