"""Rendezvous of broadcast groups: who is rank 0, where its TCP store listens, who is rank r.

Decisions:
- The trainer (rank 0) hosts the group's `torch.distributed.TCPStore` and reports its
  address here; weightsync hands that address and a rank to each replica. Weightsync
  itself stays torch-free: it only hands out the rendezvous information.
- A torch.distributed group has a fixed world size, so replicas get ranks 1..N in the
  order they join, and a replica arriving once the group is full is told it is not a
  member (with the reason). It then follows versions through the filesystem path,
  which every broadcast version is also written to. A replica rejoining under the same
  id gets its old rank back.
- Each trainer join starts a new *generation* (a restarted trainer's old group is dead);
  replicas of an older generation must rejoin.
- A replica's join waits (asyncio.Condition) until a trainer has joined, bounded by the
  caller's deadline, so services may start in any order.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tidal.common.errors import InvalidArgument
from tidal.weightsync.config import BroadcastTransport


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


class BroadcastRendezvous:
    def __init__(self, config: BroadcastTransport) -> None:
        self.config = config
        self.world_size = config.replicas + 1
        self._store_address = ""
        self._generation = 0
        self._ranks: dict[str, int] = {}  # replica id → rank in the current generation
        self._changed = asyncio.Condition()

    def _seat(self, *, rank: int, reason: str = "") -> GroupSeat:
        return GroupSeat(
            member=rank >= 0,
            reason=reason,
            store_address=self._store_address,
            rank=rank,
            world_size=self.world_size,
            backend=self.config.backend,
            bucket_bytes=self.config.bucket_bytes,
            timeout_s=self.config.timeout_s,
            generation=self._generation,
        )

    async def join_trainer(self, store_address: str) -> GroupSeat:
        host, _, port = store_address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument("store_address", f"must be host:port, got {store_address!r}")
        async with self._changed:
            self._store_address = store_address
            self._generation += 1
            self._ranks.clear()
            self._changed.notify_all()
        return self._seat(rank=0)

    async def join_replica(self, replica_id: str) -> GroupSeat:
        if not replica_id:
            raise InvalidArgument("member_id", "must name the replica")
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._store_address))
        if replica_id in self._ranks:
            return self._seat(rank=self._ranks[replica_id])
        if len(self._ranks) >= self.config.replicas:
            reason = (
                f"the broadcast group of generation {self._generation} is full "
                f"({self.config.replicas} replicas); follow versions through the filesystem"
            )
            return self._seat(rank=-1, reason=reason)
        rank = len(self._ranks) + 1
        self._ranks[replica_id] = rank
        return self._seat(rank=rank)


@dataclass(frozen=True)
class SyncPlan:
    """What `JoinSync` tells a trainer or replica: the data path and, for broadcast, its seat."""

    transport: str
    chunk_bytes: int
    seat: GroupSeat | None = None
