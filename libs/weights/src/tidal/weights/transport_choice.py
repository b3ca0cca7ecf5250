"""What `JoinSync` answers: the run's data path and, for broadcast, the caller's seat.

Domain types both sides of `JoinSync` share: weightsync's rendezvous hands them out, and
trainer and inference pick their transport from them (`transports.factory`). On the
wire the reply is a `SyncPlan` message carrying a `BroadcastGroup`.
"""

from __future__ import annotations

from dataclasses import dataclass

FILESYSTEM = "filesystem"
BROADCAST = "broadcast"
STREAM = "stream"
TRANSPORTS = (FILESYSTEM, BROADCAST, STREAM)


@dataclass(frozen=True)
class BroadcastSeat:
    """A caller's seat in the broadcast group: where to meet (TCP store), its rank of
    `world_size` in `generation`, the group's settings; `member=False` (with the
    `reason`): no seat, follow versions through the shared folder."""

    member: bool
    reason: str
    store_address: str
    rank: int
    world_size: int
    backend: str
    bucket_bytes: int
    timeout_s: float
    generation: int


@dataclass(frozen=True)
class TransportChoice:
    """What `JoinSync` tells a trainer or replica: the data path and, for broadcast, its seat."""

    transport: str
    chunk_bytes: int
    seat: BroadcastSeat | None = None
