"""The async window: how far generation may run ahead of training, and what is too stale.

`AsyncWindow` owns every rule that involves `max_async` or the off-policy bound, so the
loop asks it questions instead of doing the arithmetic. Steps are 1-indexed and versions
0-indexed: step n's rollouts start once inference has *loaded* version
`max(0, n - 1 - max_async)` (loaded, not published: a version not yet served would make
rollouts staler than promised), and a sample's staleness is `(n - 1) - ` the oldest
version among its tokens. Loaded versions are pushed (peers/version_feed.py), never polled;
while one is awaited, `stalled` asks whether it can still come (a trainer whose writes met
a full disk publishes nothing more, and says so only when asked).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from tidal.orchestrator.config import StalenessConfig

STALLED_CHECK_S = 1.0
"""While a version is awaited, how often `AsyncWindow.stalled` is asked."""


class LoadedVersionSource(Protocol):
    """The version inference has loaded, as pushed to the orchestrator (the inference pool)."""

    def loaded_version(self) -> int: ...

    async def wait_loaded(self, version: int) -> int: ...


class HasStaleness(Protocol):
    @property
    def staleness(self) -> int: ...


S = TypeVar("S", bound=HasStaleness)


class PolicyVersionTimeout(TimeoutError):
    """Inference did not load a needed version in time."""


def version_staleness(step: int, version: int) -> int:
    """How many optimizer steps `version` lags behind the policy step `step` updates."""
    return (step - 1) - version


def sample_staleness(step: int, policy_versions: Sequence[int], *, fallback_version: int) -> int:
    """`(step - 1) - oldest version`; a completion with no tokens uses `fallback_version`."""
    return version_staleness(step, min(policy_versions, default=fallback_version))


class AsyncWindow:
    def __init__(
        self,
        config: StalenessConfig,
        inference: LoadedVersionSource,
        *,
        wait_timeout_s: float,
        stalled: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.max_async = config.max_async
        self.bound = config.bound
        """The largest staleness a kept sample may have (max_off_policy_steps)."""
        self.inference = inference
        self.wait_timeout_s = wait_timeout_s
        self.stalled = stalled
        """Asked every STALLED_CHECK_S while a version is awaited; raises when it never
        will come (the trainer could not write it for want of space)."""
        self.loaded = -1
        """Newest version inference was seen to have loaded (-1 before any)."""

    def needed_version(self, step: int) -> int:
        """The version inference must have loaded before step `step`'s rollouts start."""
        return max(0, step - 1 - self.max_async)

    def last_startable_step(self, newest_trained: int) -> int:
        """The last step whose generation may start once step `newest_trained` is trained."""
        return newest_trained + 1 + self.max_async

    def staleness(self, step: int, policy_versions: Sequence[int], *, fallback_version: int) -> int:
        return sample_staleness(step, policy_versions, fallback_version=fallback_version)

    def drop_stale(self, samples: Sequence[S]) -> tuple[list[S], int]:
        """The samples within the bound, and how many were dropped."""
        kept = [s for s in samples if s.staleness <= self.bound]
        return kept, len(samples) - len(kept)

    async def wait_for_step(self, step: int) -> int:
        """Wait until step `step` may generate; returns the version inference has loaded."""
        return await self.wait_loaded(self.needed_version(step))

    async def wait_loaded(self, version: int, *, timeout: float | None = None) -> int:
        """Wait until inference has loaded `version` or newer; returns what it has loaded.

        Raises PolicyVersionTimeout after `timeout` (default: the window's wait timeout).
        """
        self.loaded = max(self.loaded, self.inference.loaded_version())
        if self.loaded >= version:
            return self.loaded
        timeout = self.wait_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        waiter = asyncio.ensure_future(self.inference.wait_loaded(version))
        try:
            while not waiter.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PolicyVersionTimeout(
                        f"inference still serves version {self.inference.loaded_version()} "
                        f"after {timeout:.0f}s; version {version} is needed (is it subscribed "
                        "to weightsync? orchestrator.timeouts.peer_wait_s sets how long to wait)"
                    )
                slice_s = left if self.stalled is None else min(left, STALLED_CHECK_S)
                done, _ = await asyncio.wait([waiter], timeout=slice_s)
                if not done and self.stalled is not None:
                    await self.stalled()
            loaded = waiter.result()
        finally:
            waiter.cancel()
        self.loaded = max(self.loaded, loaded)
        return self.loaded
