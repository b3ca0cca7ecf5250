"""The broadcast transport: a torch.distributed group from trainer rank 0 to the
replicas, with every version also written to the shared folder for catch-up.

The sender broadcasts first, then, once the replicas confirm they serve the version (or
a short wait runs out), writes and registers it as the filesystem path does: `send`
returns once it is registered. Until the group forms, and while a broken one re-forms as
a new generation, versions go by the filesystem only. The receiver installs and confirms
each pushed version, rejoins the next generation when the group breaks, and pulls from
the shared folder (a replica without a seat only pulls).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from tidal.weights.broadcast_group import (
    BroadcastGroup,
    connect_store,
    dispose_in_background,
    host_store,
    in_daemon_thread,
)
from tidal.weights.manifest import WeightManifest
from tidal.weights.transport_choice import BroadcastSeat
from tidal.weights.transports.base import Install, VersionPayload, WeightSender
from tidal.weights.transports.filesystem import FilesystemReceiver, FilesystemSender

if TYPE_CHECKING:
    from tidal.weights.client import WeightSyncClient

log = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 120.0
JOIN_TIMEOUT_S = 300.0
BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0


class BroadcastSender(WeightSender):
    def __init__(
        self, root: Path, client: WeightSyncClient, *, member_id: str, advertise_host: str
    ) -> None:
        self.client = client
        self.member_id = member_id
        self.advertise_host = advertise_host
        """Host the replicas reach this trainer's TCP store at."""
        self.catch_up = FilesystemSender(root, client)
        self.seat: BroadcastSeat | None = None
        self._group: asyncio.Future[BroadcastGroup] | None = None
        self._broken = False
        self._store: Any = None  # the group's TCP store, kept across generations
        self._store_address = ""

    async def start(self) -> None:
        store = host_store(self.advertise_host, STARTUP_TIMEOUT_S)
        address = f"{self.advertise_host}:{store.port}"
        self._store, self._store_address = store, address
        choice = await self.client.join_sync(
            self.member_id, "trainer", store_address=address, timeout=STARTUP_TIMEOUT_S
        )
        assert choice.seat is not None
        self.seat = choice.seat
        log.info("broadcast group: hosting its store at %s, waiting for replicas", address)
        self._group = in_daemon_thread(BroadcastGroup, store, choice.seat)

    async def ready(self) -> bool:
        """Wait until the group has formed (True) or failed to (False)."""
        if self._group is None:
            return False
        try:
            await asyncio.shield(self._group)
        except RuntimeError:
            return False
        return not self._broken

    async def send(self, payload: VersionPayload) -> WeightManifest:
        await self._broadcast(payload)
        return await self.catch_up.send(payload)

    async def _broadcast(self, payload: VersionPayload) -> None:
        """Send to the group when it is ready; a failure only disables broadcasting."""
        group = self._group
        if group is None or self._broken or not group.done():
            return
        if group.exception() is not None:
            log.warning(
                "broadcast group did not form (%s); using the filesystem", group.exception()
            )
            self._broken = True
            return
        version = payload.version
        try:
            await in_daemon_thread(
                group.result().send,
                version,
                payload.step,
                payload.hf_config,
                payload.state_dict,
                payload.trace_context,
            )
            # The replicas copy the version into their engines now; the catch-up copy
            # (written next) would compete with them for the cores, so it waits for them.
            await in_daemon_thread(group.result().wait_confirmed, version)
        except RuntimeError as exc:  # a replica died mid-broadcast (gloo/NCCL error)
            log.warning("broadcast of version %d failed (%s); re-forming the group", version, exc)
            try:
                group.result().abandon()  # receivers still waiting on it rejoin now
            except RuntimeError as abandon_exc:
                log.warning("could not mark the broken group abandoned: %s", abandon_exc)
            self._group = asyncio.ensure_future(self._reform())

    async def _reform(self) -> BroadcastGroup:
        """A new generation of the group with the replicas that rejoin (weightsync waits
        `reform_window_s` for them); raises RuntimeError when none does."""
        choice = await self.client.join_sync(
            self.member_id, "trainer", store_address=self._store_address,
            timeout=STARTUP_TIMEOUT_S,
        )  # fmt: skip
        seat = choice.seat
        if seat is None or seat.world_size < 2:
            raise RuntimeError("no replica rejoined the broadcast group")
        log.info("broadcast group re-formed: generation %d, %d ranks", seat.generation,
                 seat.world_size)  # fmt: skip
        self.seat = seat
        return await in_daemon_thread(BroadcastGroup, self._store, seat)


class BroadcastReceiver(FilesystemReceiver):
    """Pulls from the shared folder (catch-up); `run` receives the group's pushes."""

    def __init__(self, client: WeightSyncClient, seat: BroadcastSeat, *, replica_id: str) -> None:
        self.client = client
        self.seat = seat
        self.replica_id = replica_id

    async def run(self, install: Install) -> None:
        """Receive versions from the group; when it breaks, rejoin the next generation."""
        seat = self.seat
        if not seat.member:
            log.info("not in the broadcast group (%s)", seat.reason)
            return
        while seat.member:
            if not await self._receive_generation(seat, install):
                return  # the trainer closed the group
            seat = await self._rejoin(seat.generation)
        log.info("not in the re-formed broadcast group (%s)", seat.reason)

    async def _receive_generation(self, seat: BroadcastSeat, install: Install) -> bool:
        """Receive until the sender closes (False) or the group breaks (True)."""
        holder: list[BroadcastGroup] = []
        try:
            store = await in_daemon_thread(connect_store, seat.store_address, seat.timeout_s)
            holder.append(await in_daemon_thread(BroadcastGroup, store, seat))
            log.info(
                "joined broadcast generation %d as rank %d of %d",
                seat.generation,
                seat.rank,
                seat.world_size,
            )
            while (received := await holder[0].receive()) is not None:
                await install(received)  # copies: the next receive reuses the buffer
                holder[0].confirm(received.version)  # the trainer writes the catch-up now
            return False
        except RuntimeError as exc:  # a peer died, or the group never formed
            log.warning(
                "broadcast generation %d broke (%s); rejoining, the filesystem meanwhile",
                seat.generation,
                exc,
            )
            return True
        finally:
            dispose_in_background(holder)  # its pending receives must not block this loop

    async def _rejoin(self, broken_generation: int) -> BroadcastSeat:
        """This replica's seat in the generation after `broken_generation` (waits for the
        trainer to re-form the group; retried while weight-sync is unreachable)."""
        backoff = BACKOFF_START_S
        while True:
            try:
                choice = await self.client.join_sync(
                    self.replica_id,
                    "replica",
                    after_generation=broken_generation,
                    timeout=JOIN_TIMEOUT_S,
                )
                assert choice.seat is not None
                return choice.seat
            except grpc.aio.AioRpcError as exc:
                log.warning("rejoining the broadcast group failed (%s)", exc.code().name)
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, BACKOFF_MAX_S)
