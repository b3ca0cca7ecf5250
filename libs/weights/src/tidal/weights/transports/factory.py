"""Pick a run's transport once, from weightsync's `TransportChoice` (the only place that reads
the transport's name on the trainer and replica side).

Senders and receivers of the broadcast path import torch.distributed; they are imported
only when weightsync chooses broadcast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tidal.weights.transport_choice import (
    BROADCAST,
    FILESYSTEM,
    STREAM,
    TRANSPORTS,
    TransportChoice,
)
from tidal.weights.transports.base import WeightReceiver, WeightSender

if TYPE_CHECKING:
    from tidal.weights.client import WeightSyncClient


def make_sender(
    choice: TransportChoice,
    *,
    client: WeightSyncClient,
    root: Path,
    member_id: str,
    advertise_host: str,
) -> WeightSender:
    """The trainer's sender for `choice` (call its `start` before the first `send`)."""
    if choice.transport == FILESYSTEM:
        from tidal.weights.transports.filesystem import FilesystemSender

        return FilesystemSender(root, client)
    if choice.transport == STREAM:
        from tidal.weights.transports.stream import StreamSender

        return StreamSender(client, chunk_bytes=choice.chunk_bytes)
    if choice.transport == BROADCAST:
        from tidal.weights.transports.broadcast import BroadcastSender

        return BroadcastSender(root, client, member_id=member_id, advertise_host=advertise_host)
    raise ValueError(_unknown(choice))


def make_receiver(
    choice: TransportChoice, *, client: WeightSyncClient, replica_id: str
) -> WeightReceiver:
    """A replica's receiver for `choice` (broadcast without a seat only pulls)."""
    if choice.transport == FILESYSTEM or (choice.transport == BROADCAST and choice.seat is None):
        from tidal.weights.transports.filesystem import FilesystemReceiver

        return FilesystemReceiver()
    if choice.transport == STREAM:
        from tidal.weights.transports.stream import StreamReceiver

        return StreamReceiver(client)
    if choice.transport == BROADCAST:
        from tidal.weights.transports.broadcast import BroadcastReceiver

        assert choice.seat is not None
        return BroadcastReceiver(client, choice.seat, replica_id=replica_id)
    raise ValueError(_unknown(choice))


def _unknown(choice: TransportChoice) -> str:
    return f"weightsync's transport {choice.transport!r} is not one of {', '.join(TRANSPORTS)}"
