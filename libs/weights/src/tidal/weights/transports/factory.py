"""Pick a run's transport once, from weightsync's `SyncPlan` (the only place that reads
the transport's name on the trainer and replica side).

Senders and receivers of the broadcast path import torch.distributed; they are imported
only when the plan asks for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tidal.weights.plan import BROADCAST, FILESYSTEM, STREAM, TRANSPORTS, SyncPlan
from tidal.weights.transports.base import WeightReceiver, WeightSender

if TYPE_CHECKING:
    from tidal.weights.client import WeightSyncClient


def make_sender(
    plan: SyncPlan,
    *,
    client: WeightSyncClient,
    root: Path,
    member_id: str,
    advertise_host: str,
) -> WeightSender:
    """The trainer's sender for `plan` (call its `start` before the first `send`)."""
    if plan.transport == FILESYSTEM:
        from tidal.weights.transports.filesystem import FilesystemSender

        return FilesystemSender(root, client)
    if plan.transport == STREAM:
        from tidal.weights.transports.stream import StreamSender

        return StreamSender(client, chunk_bytes=plan.chunk_bytes)
    if plan.transport == BROADCAST:
        from tidal.weights.transports.broadcast import BroadcastSender

        return BroadcastSender(root, client, member_id=member_id, advertise_host=advertise_host)
    raise ValueError(_unknown(plan))


def make_receiver(plan: SyncPlan, *, client: WeightSyncClient, replica_id: str) -> WeightReceiver:
    """A replica's receiver for `plan` (broadcast without a seat only pulls)."""
    if plan.transport == FILESYSTEM or (plan.transport == BROADCAST and plan.seat is None):
        from tidal.weights.transports.filesystem import FilesystemReceiver

        return FilesystemReceiver()
    if plan.transport == STREAM:
        from tidal.weights.transports.stream import StreamReceiver

        return StreamReceiver(client)
    if plan.transport == BROADCAST:
        from tidal.weights.transports.broadcast import BroadcastReceiver

        assert plan.seat is not None
        return BroadcastReceiver(client, plan.seat, replica_id=replica_id)
    raise ValueError(_unknown(plan))


def _unknown(plan: SyncPlan) -> str:
    return f"weightsync's transport {plan.transport!r} is not one of {', '.join(TRANSPORTS)}"
