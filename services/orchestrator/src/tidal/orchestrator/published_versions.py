"""Which policy version weightsync has published, for GetProgress's `policy_version`.

Decisions:
- A lost stream (weightsync restarted) is reopened after a backoff (0.5 s doubling to
  5 s) after the newest version seen, with a warning naming weightsync and its address;
  the stream is informational, so losing it never fails the run, and it is followed
  for as long as the run lasts.
- Published versions come from weightsync's Watch stream (pushed, no polling) and feed
  GetProgress's `policy_version`. They do not gate generation: whether inference has
  *loaded* a version is what does (staleness.py), since a published version inference
  has not loaded yet would make a step's rollouts staler than promised.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from tidal.orchestrator.run_status import ProgressState
from tidal.weights.client import WeightSyncClient

log = logging.getLogger(__name__)


async def follow_publishes(
    weightsync: WeightSyncClient,
    replica_id: str,
    progress: ProgressState,
    *,
    address: str = "",
    first_backoff_s: float = 0.5,
    max_backoff_s: float = 5.0,
) -> None:
    """Record every published version in the progress state (runs until cancelled),
    reopening the stream whenever weightsync goes away."""
    delay = first_backoff_s
    while True:
        try:
            async for event in weightsync.watch(replica_id, after_version=progress.policy_version):
                progress.saw_version(event.manifest.version)
                delay = first_backoff_s
                log.debug("version %d published", event.manifest.version)
            reason = "the stream ended"
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        log.warning(
            "weightsync at %s: version stream lost (%s); reconnecting in %.1fs",
            address or "?",
            reason,
            delay,
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_backoff_s)
