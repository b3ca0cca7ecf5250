"""The versions weightsync pushes: the newest published one and what each replica serves.

One WatchLoaded subscription per run (`VersionFeed.follow`) keeps the feed current;
GetProgress reads the published version, the inference pool each replica's loaded version,
and the async window waits on the feed's changes instead of asking inference. Every event
is weightsync's whole state, so a stream reopened after weightsync restarts starts with a
replay. A replica's version only grows here: a restarted weightsync that has not heard
from a replica yet never takes its version back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from tidal.weights.client import WeightSyncClient
from tidal.weights.manifest import LoadedVersions

log = logging.getLogger(__name__)


class VersionFeed:
    def __init__(self, *, on_published: Callable[[int], None] | None = None) -> None:
        self.published = -1
        """Newest version weightsync reported published (-1 before any)."""
        self.on_published = on_published
        self._loaded: dict[str, int] = {}
        self._changed = asyncio.Event()  # set and replaced at every change

    def loaded(self, replica_id: str) -> int:
        """Newest version `replica_id` was reported to serve (-1: none known)."""
        return self._loaded.get(replica_id, -1)

    def apply(self, state: LoadedVersions) -> None:
        """Fold one pushed state in and wake the waiters."""
        self.published = max(self.published, state.published)
        for replica_id, version in state.replicas.items():
            self._loaded[replica_id] = max(self.loaded(replica_id), version)
        if self.on_published is not None:
            self.on_published(self.published)
        self.changed()

    def changed(self) -> None:
        """Wake the waiters to re-check (a push, or a replica that stopped or returned)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Return once `ready()` holds, re-checking it at every change."""
        while not ready():
            await self._changed.wait()

    async def follow(
        self,
        weightsync: WeightSyncClient,
        *,
        address: str = "",
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 5.0,
    ) -> None:
        """Apply every pushed state (runs until cancelled), reopening the stream after a
        backoff whenever weightsync goes away."""
        delay = first_backoff_s
        while True:
            try:
                async for state in weightsync.watch_loaded():
                    self.apply(state)
                    delay = first_backoff_s
                reason = "the stream ended"
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            log.warning(
                "weightsync at %s: loaded-version stream lost (%s); reconnecting in %.1fs",
                address or "?",
                reason,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff_s)
