"""Each inference replica's pushed occupancy, followed for routing and admission.

One WatchOccupancy stream per replica (`follow_occupancy`) hands every report on; a
stream that fails (the replica stopped or restarted) is reopened after a short backoff,
and the replica counts as not reporting meanwhile. A report older than `STALE_S` counts as
none, so a stalled stream cannot pin old figures. A replica that does not serve
WatchOccupancy (UNIMPLEMENTED) is not asked again; a refused one (its role, say) is warned
about once and asked again. Without figures the pool routes by its own count of
outstanding work and the in-flight bound stays where it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from tidal.orchestrator.config import InflightConfig
from tidal.orchestrator.peers.inference_client import InferenceClient, ReplicaOccupancy
from tidal.orchestrator.peers.peer_client import PeerError

log = logging.getLogger(__name__)

MIN_INTERVAL_MS = 100
"""The replica reports a change at most this often."""
HEARTBEAT_MS = 1000
"""The replica repeats unchanged figures at least this often."""
STALE_S = 3 * HEARTBEAT_MS / 1000
"""A report older than three heartbeats counts as none."""
FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 2.0


def fresh(occupancy: ReplicaOccupancy | None, now: float) -> ReplicaOccupancy | None:
    """`occupancy` if it arrived within `STALE_S` of `now`, else None."""
    if occupancy is None or now - occupancy.received_at > STALE_S:
        return None
    return occupancy


def saturated(occupancy: ReplicaOccupancy | None, targets: InflightConfig, now: float) -> bool:
    """Whether a fresh report shows a queue or KV cache past the in-flight targets."""
    report = fresh(occupancy, now)
    return report is not None and (
        report.queued > targets.queue_target or report.kv_usage > targets.kv_usage_target
    )


REFUSALS = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)
"""A stream refused for what the orchestrator sent, not lost: warned about, once each."""


async def follow_occupancy(
    client: Callable[[], InferenceClient],
    report: Callable[[ReplicaOccupancy | None], Awaitable[None]],
) -> None:
    """Hand each report of the replica `client()` talks to to `report` (None when its
    stream is lost), reopening the stream on the current channel; runs until cancelled."""
    delay = FIRST_BACKOFF_S
    reporting = lost = False
    warned: set[str] = set()
    while True:
        replica = client()
        try:
            async for occupancy in replica.watch_occupancy(
                min_interval_ms=MIN_INTERVAL_MS, heartbeat_ms=HEARTBEAT_MS
            ):
                if lost:
                    log.info("inference at %s: occupancy stream reopened", replica.address)
                reporting, lost, delay = True, False, FIRST_BACKOFF_S
                await report(occupancy)
            reason = "the stream ended"
        except PeerError as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                log.warning(
                    "inference at %s does not push its occupancy (%s); routing to it by "
                    "outstanding work alone",
                    replica.address,
                    exc,
                )
                await report(None)
                return
            reason = str(exc)
            if exc.code in REFUSALS and reason not in warned:
                warned.add(reason)
                log.warning("cannot watch the occupancy of inference: %s", reason)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this follower itself was cancelled
            reason = "the stream was cancelled with its channel"
        await report(None)
        if reporting:  # once per loss, not once per attempt while the replica is down
            log.info("inference at %s: occupancy stream lost (%s)", replica.address, reason)
            reporting, lost = False, True
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_BACKOFF_S)
