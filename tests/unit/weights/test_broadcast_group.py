"""The broadcast group's receive buffer and confirm handshake, over real gloo.

Both members live in this process (rank 0 sends from a thread, rank 1 receives on the
event loop) on one TCP store: the same `BroadcastGroup` code the trainer and a replica
run, without spawning processes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import torch

from tidal.weights.broadcast_group import BroadcastGroup, connect_store, host_store
from tidal.weights.transport_choice import BroadcastSeat


def seat(address: str, rank: int) -> BroadcastSeat:
    return BroadcastSeat(
        member=True,
        reason="",
        store_address=address,
        rank=rank,
        world_size=2,
        backend="gloo",
        bucket_bytes=1000,  # not a multiple of any tensor: buckets split tensors
        timeout_s=30.0,
        generation=1,
    )


@pytest.fixture
def pair() -> Iterator[tuple[BroadcastGroup, BroadcastGroup]]:
    store = host_store("127.0.0.1", 30.0)
    address = f"127.0.0.1:{store.port}"
    groups: dict[int, BroadcastGroup] = {}

    def join(rank: int) -> None:
        member_store = store if rank == 0 else connect_store(address, 30.0)
        groups[rank] = BroadcastGroup(member_store, seat(address, rank))

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert set(groups) == {0, 1}, "the group did not form"
    yield groups[0], groups[1]


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(37, 16, generator=g).to(torch.bfloat16),  # (V, D)
        "norm": torch.randn(16, generator=g),  # (D,) fp32
        "proj": torch.randn(16, 24, generator=g).to(torch.bfloat16),  # (D, F)
    }


async def send_and_receive(
    sender: BroadcastGroup, receiver: BroadcastGroup, version: int, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    sending = asyncio.ensure_future(
        asyncio.to_thread(sender.send, version, version, {"model_type": "llama"}, state)
    )
    received = await receiver.receive()
    await sending
    assert received is not None and received.version == version
    return received.state_dict


async def test_receive_buffer_is_reused_across_versions_and_stays_bit_identical(
    pair: tuple[BroadcastGroup, BroadcastGroup],
) -> None:
    sender, receiver = pair
    first = await send_and_receive(sender, receiver, 1, weights(1))
    assert all(torch.equal(first[k], v) for k, v in weights(1).items())
    second = await send_and_receive(sender, receiver, 2, weights(2))
    # Same layout: no fresh allocation, the second version views the first one's buffer.
    assert all(first[k].data_ptr() == second[k].data_ptr() for k in first)
    assert all(torch.equal(second[k], v) for k, v in weights(2).items())
    # The first version's views now show the second's bytes: callers copy before the
    # next receive (the watcher installs each version first).
    assert torch.equal(first["embed"], second["embed"])

    grown = {**weights(3), "extra": torch.ones(5, 5)}
    third = await send_and_receive(sender, receiver, 3, grown)
    assert all(torch.equal(third[k], v) for k, v in grown.items())


async def test_sender_waits_for_the_replica_to_confirm_before_the_catch_up_copy(
    pair: tuple[BroadcastGroup, BroadcastGroup],
) -> None:
    sender, receiver = pair
    await send_and_receive(sender, receiver, 1, weights(1))
    waiting = asyncio.ensure_future(asyncio.to_thread(sender.wait_confirmed, 1, 30.0))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "the sender went on before the replica confirmed"
    receiver.confirm(1)
    assert await asyncio.wait_for(waiting, 10) == 1


async def test_unconfirmed_version_is_waited_for_at_most_the_bound(
    pair: tuple[BroadcastGroup, BroadcastGroup],
) -> None:
    sender, receiver = pair
    await send_and_receive(sender, receiver, 1, weights(1))
    receiver.confirm(1)  # a confirm of another version does not count
    assert await asyncio.to_thread(sender.wait_confirmed, 2, 0.2) == 0
