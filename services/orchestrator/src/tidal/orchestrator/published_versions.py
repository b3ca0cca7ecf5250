"""Which policy version weightsync has published, for GetProgress's `policy_version`.

Decisions:
- Published versions come from weightsync's Watch stream (pushed, no polling) and feed
  GetProgress's `policy_version`. They do not gate generation: whether inference has
  *loaded* a version is what does (staleness.py), since a published version inference
  has not loaded yet would make a step's rollouts staler than promised.
"""

from __future__ import annotations

import logging

from tidal.orchestrator.run_status import ProgressState
from tidal.weights.client import WeightSyncClient

log = logging.getLogger(__name__)


async def follow_publishes(
    weightsync: WeightSyncClient, replica_id: str, progress: ProgressState
) -> None:
    """Record every published version in the progress state (runs until cancelled)."""
    async for event in weightsync.watch(replica_id, after_version=progress.policy_version):
        progress.saw_version(event.manifest.version)
        log.debug("version %d published", event.manifest.version)
