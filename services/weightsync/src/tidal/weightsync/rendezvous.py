"""Rendezvous of broadcast groups: who is rank 0, where its TCP store listens, who is rank r.

Weightsync only hands out addresses and ranks, so it stays torch-free. Replicas get ranks
1..N in join order, a replica joining a full group is told it is not a member, and a
rejoining id gets its rank back. Each trainer join starts a generation; a later one is
whoever rejoins within `reform_window_s`. A replica's join waits for the trainer, so the
services start in any order.
"""

from __future__ import annotations

import asyncio
import contextlib

from tidal.common.errors import InvalidArgument
from tidal.weights.transport_choice import BroadcastSeat
from tidal.weightsync.config import BroadcastTransport


class BroadcastRendezvous:
    def __init__(self, config: BroadcastTransport) -> None:
        self.config = config
        self.world_size = config.replicas + 1
        self._store_address = ""
        self._generation = 0
        self._ranks: dict[str, int] = {}  # replica id → rank in the current generation
        self._closed = False  # the current generation's membership is final
        self._changed = asyncio.Condition()

    def _seat(self, *, rank: int, reason: str = "") -> BroadcastSeat:
        return BroadcastSeat(
            member=rank >= 0,
            reason=reason,
            store_address=self._store_address,
            rank=rank,
            world_size=self.world_size if self._generation == 1 else len(self._ranks) + 1,
            backend=self.config.backend,
            bucket_bytes=self.config.bucket_bytes,
            timeout_s=self.config.timeout_s,
            generation=self._generation,
        )

    async def join_trainer(self, store_address: str) -> BroadcastSeat:
        host, _, port = store_address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument("store_address", f"must be host:port, got {store_address!r}")
        async with self._changed:
            self._store_address = store_address
            self._generation += 1
            self._ranks.clear()
            self._closed = self._generation == 1  # the first group has a fixed size
            generation = self._generation
            self._changed.notify_all()
        if generation > 1:
            await self._close_after_window(generation)
        return self._seat(rank=0)

    async def _close_after_window(self, generation: int) -> None:
        async with self._changed:
            full = lambda: len(self._ranks) >= self.config.replicas  # noqa: E731
            with contextlib.suppress(TimeoutError):  # the window closed before all rejoined
                await asyncio.wait_for(
                    self._changed.wait_for(full), timeout=self.config.reform_window_s
                )
            if self._generation == generation:
                self._closed = True
                self._changed.notify_all()

    async def join_replica(self, replica_id: str, after_generation: int = 0) -> BroadcastSeat:
        if not replica_id:
            raise InvalidArgument("member_id", "must name the replica")
        async with self._changed:
            await self._changed.wait_for(
                lambda: bool(self._store_address) and self._generation > after_generation
            )
            generation = self._generation
            if replica_id not in self._ranks:
                if len(self._ranks) >= self.config.replicas:
                    reason = (
                        f"the broadcast group of generation {generation} is full "
                        f"({self.config.replicas} replicas); follow versions through the filesystem"
                    )
                    return self._seat(rank=-1, reason=reason)
                if self._closed and generation > 1:
                    reason = (
                        f"the broadcast group of generation {generation} was re-formed without "
                        "this replica (it rejoined after the window); follow versions through "
                        "the filesystem"
                    )
                    return self._seat(rank=-1, reason=reason)
                self._ranks[replica_id] = len(self._ranks) + 1
                self._changed.notify_all()
            # A re-formed group's world size is known only once its window closes.
            await self._changed.wait_for(lambda: self._closed or self._generation != generation)
            if self._generation != generation:
                return self._seat(rank=-1, reason="the trainer rejoined meanwhile; rejoin")
            return self._seat(rank=self._ranks[replica_id])
