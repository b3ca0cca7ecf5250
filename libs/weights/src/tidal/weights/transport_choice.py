"""What `JoinSync` answers: the run's data path and, for broadcast, the caller's seat.

These are the domain types both sides of `JoinSync` share: weightsync's rendezvous hands
them out, trainer and inference pick their transport from them (`transports.factory`).
Named for what it holds, weightsync's choice of transport (the `JoinSync` reply message
is still `SyncPlan` on the wire), so it is not confused with the memory planner.
"""

from __future__ import annotations

from dataclasses import dataclass

FILESYSTEM = "filesystem"
BROADCAST = "broadcast"
STREAM = "stream"
TRANSPORTS = (FILESYSTEM, BROADCAST, STREAM)


@dataclass(frozen=True)
class GroupSeat:
    """A caller's place in the broadcast group (member=False: use the fallback path)."""

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
    seat: GroupSeat | None = None
