"""Which policy version exists where: published (weightsync) and loaded (inference).

Decisions:
- Published versions come from weightsync's Watch stream (pushed, no polling) and feed
  GetProgress's `policy_version`.
- Whether inference has *loaded* a version is what gates generation (max_async), since
  a published version inference has not loaded yet would make a step's rollouts staler
  than promised. The v1 contracts push no load events to the orchestrator (weightsync's
  Watch only announces new publishes), so the gate asks the replica's GetStatus, backing
  off from 20 ms to 100 ms: a tiny model loads in well under a second, and the status
  call is a few microseconds of server work. A push (e.g. a Watch on inference's status)
  would remove the poll; that is a contract change, not done here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from tidal.orchestrator.progress import ProgressState
from tidal.weights.client import WeightSyncClient

log = logging.getLogger(__name__)

FIRST_POLL_S = 0.02
MAX_POLL_S = 0.1


class VersionSource(Protocol):
    async def policy_version(self) -> int: ...


class PolicyVersionTimeout(TimeoutError):
    """Inference did not load a needed version in time."""


class PolicyGate:
    def __init__(self, inference: VersionSource, progress: ProgressState) -> None:
        self.inference = inference
        self.progress = progress
        self.loaded = -1
        """Newest version inference was seen to have loaded."""

    async def wait_loaded(self, version: int, *, timeout: float) -> int:
        """Wait until inference has loaded `version` or newer; returns what it has loaded."""
        deadline = time.monotonic() + timeout
        delay = FIRST_POLL_S
        while self.loaded < version:
            self.loaded = max(self.loaded, await self.inference.policy_version())
            if self.loaded >= version:
                break
            if time.monotonic() + delay > deadline:
                raise PolicyVersionTimeout(
                    f"inference still serves version {self.loaded} after {timeout:.0f}s; "
                    f"version {version} is needed (is it subscribed to weightsync?)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_POLL_S)
        return self.loaded

    async def follow_publishes(self, weightsync: WeightSyncClient, replica_id: str) -> None:
        """Record every published version in the progress state (runs until cancelled)."""
        async for event in weightsync.watch(replica_id, after_version=self.progress.policy_version):
            self.progress.saw_version(event.manifest.version)
            log.debug("version %d published", event.manifest.version)
