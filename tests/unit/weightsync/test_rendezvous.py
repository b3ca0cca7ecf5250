"""Broadcast rendezvous: ranks in join order, a full group says so, generations."""

from __future__ import annotations

import asyncio

import pytest

from tidal.common.errors import InvalidArgument
from tidal.weightsync.config import BroadcastTransport
from tidal.weightsync.rendezvous import BroadcastRendezvous


async def test_replicas_get_ranks_in_join_order_and_keep_them() -> None:
    rdv = BroadcastRendezvous(BroadcastTransport(replicas=2, bucket_bytes=1024))
    trainer = await rdv.join_trainer("10.0.0.1:1234")
    assert (trainer.rank, trainer.world_size, trainer.member) == (0, 3, True)
    a = await rdv.join_replica("a")
    b = await rdv.join_replica("b")
    assert (a.rank, b.rank) == (1, 2)
    assert a.store_address == "10.0.0.1:1234" and a.bucket_bytes == 1024
    assert (await rdv.join_replica("a")).rank == 1  # a rejoin keeps its seat
    late = await rdv.join_replica("c")
    assert not late.member and "is full (2 replicas)" in late.reason


async def test_replica_waits_for_the_trainer() -> None:
    rdv = BroadcastRendezvous(BroadcastTransport(replicas=1))
    pending = asyncio.create_task(rdv.join_replica("a"))
    await asyncio.sleep(0.05)
    assert not pending.done()
    await rdv.join_trainer("127.0.0.1:5000")
    seat = await asyncio.wait_for(pending, 5)
    assert seat.rank == 1 and seat.generation == 1


async def test_trainer_rejoin_starts_a_new_generation() -> None:
    rdv = BroadcastRendezvous(BroadcastTransport(replicas=1))
    await rdv.join_trainer("127.0.0.1:5000")
    await rdv.join_replica("a")
    again = asyncio.create_task(rdv.join_trainer("127.0.0.1:6000"))
    seat = await rdv.join_replica("b", after_generation=1)  # the old group's seats are gone
    assert seat.member and seat.rank == 1 and seat.store_address == "127.0.0.1:6000"
    assert (await again).generation == 2  # all seats taken: no need to wait for the window


async def test_reformed_group_is_whoever_rejoins_within_the_window() -> None:
    rdv = BroadcastRendezvous(BroadcastTransport(replicas=3, reform_window_s=0.3))
    await rdv.join_trainer("127.0.0.1:5000")
    for name in ("a", "b", "c"):
        await rdv.join_replica(name)
    # "b" died; the survivors rejoin, waiting for the generation after the broken one.
    survivors = [asyncio.create_task(rdv.join_replica(n, after_generation=1)) for n in "ac"]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in survivors)  # nothing newer than generation 1 yet
    trainer = await rdv.join_trainer("127.0.0.1:5000")  # returns when the window closes
    a, c = [await t for t in survivors]
    assert (trainer.generation, trainer.world_size) == (2, 3)
    assert {a.rank, c.rank} == {1, 2} and a.world_size == c.world_size == 3
    late = await rdv.join_replica("b", after_generation=1)
    assert not late.member and "re-formed without this replica" in late.reason


async def test_bad_join_requests_name_the_field() -> None:
    rdv = BroadcastRendezvous(BroadcastTransport())
    with pytest.raises(InvalidArgument, match=r"^store_address: must be host:port"):
        await rdv.join_trainer("nowhere")
    await rdv.join_trainer("127.0.0.1:1")
    with pytest.raises(InvalidArgument, match=r"^member_id"):
        await rdv.join_replica("")
