"""The orchestrator's version feed over a real weight-sync service: it learns what each
replica serves from the pushed events (no call to inference), the async window's gate
opens on that push, and a restarted weightsync neither loses nor takes back a version.

The replica here is the weight-sync client making the calls an inference replica makes
(Watch, AckLoaded); the service, the feed, the pool and the window are the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.orchestrator.config import StalenessConfig
from tidal.orchestrator.peers.inference_pool import InferencePool
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.orchestrator.staleness import AsyncWindow
from tidal.weights.client import WeightSyncClient
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

from .test_weightsync_service import publish_files


async def pushed(feed: VersionFeed, ready: Callable[[], bool]) -> None:
    """Wait (bounded) until the feed has received a state in which `ready()` holds."""
    await asyncio.wait_for(feed.wait_until(ready), 15)


@pytest.fixture
async def followed(weightsync_server: Any) -> AsyncIterator[tuple[VersionFeed, WeightSyncClient]]:
    """A feed following the service, and a client to act as publisher and replica."""
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    published: list[int] = []
    feed = VersionFeed(on_published=published.append)
    following = asyncio.create_task(feed.follow(client, first_backoff_s=0.05))
    yield feed, client
    following.cancel()
    await client.close()


async def test_the_feed_learns_a_loaded_version_from_the_pushed_event(
    weightsync_server: Any, followed: tuple[VersionFeed, WeightSyncClient]
) -> None:
    feed, client = followed
    await client.publish(publish_files(weightsync_server.root, 0))
    replica = client.watch("replica-a", after_version=-1)
    await anext(replica)
    await pushed(feed, lambda: feed.published == 0)
    assert feed.loaded("replica-a") == -1  # registered, nothing loaded yet
    await client.ack_loaded("replica-a", 0)
    await pushed(feed, lambda: feed.loaded("replica-a") == 0)
    assert feed.loaded("another-replica") == -1


async def test_the_window_opens_when_the_replica_it_routes_to_acknowledges(
    weightsync_server: Any, followed: tuple[VersionFeed, WeightSyncClient]
) -> None:
    feed, client = followed
    # the pool's replica is never dialled here: its id is what GetStatus would tell
    pool = InferencePool(["127.0.0.1:1"], security=PLAINTEXT_LOOPBACK, versions=feed)
    pool.replicas[0].replica_id = "replica-a"
    window = AsyncWindow(StalenessConfig(max_async=0), pool, wait_timeout_s=15)
    await client.publish(publish_files(weightsync_server.root, 0))
    replica = client.watch("replica-a", after_version=-1)
    await anext(replica)
    waiting = asyncio.create_task(window.wait_for_step(1))  # step 1 needs version 0
    await pushed(feed, lambda: feed.published == 0)
    assert not waiting.done()
    await client.ack_loaded("replica-a", 0)
    assert await asyncio.wait_for(waiting, 15) == 0
    await pool.close()


async def start_weightsync_on(root: Path, address: str) -> GrpcServer:
    servicer = WeightSyncServicer(VersionRegistry(root, keep_last=3), chunk_bytes=1 << 16)
    binding = ServiceBinding(
        servicer,
        add_to_server,
        "tidal.rpc.v1.WeightSyncService",
    )
    server = GrpcServer(
        address, [binding], GrpcConfig(shutdown_grace_s=0.2), security=PLAINTEXT_LOOPBACK
    )
    await server.start()
    return server


async def test_a_restarted_weightsync_replays_its_state_and_the_feed_keeps_what_it_knew(
    tmp_path: Path,
) -> None:
    root = tmp_path / "weights"
    root.mkdir()
    server = await start_weightsync_on(root, "127.0.0.1:0")
    address = f"127.0.0.1:{server.port}"
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    feed = VersionFeed()
    following = asyncio.create_task(feed.follow(client, first_backoff_s=0.05))
    try:
        await client.publish(publish_files(root, 0))
        replica = client.watch("replica-a", after_version=-1)
        await anext(replica)
        await client.ack_loaded("replica-a", 0)
        await pushed(feed, lambda: feed.loaded("replica-a") == 0)
        await replica.aclose()
        await server.stop()
        server = await start_weightsync_on(root, address)  # knows no replica yet
        await client.publish(publish_files(root, 1))
        await pushed(feed, lambda: feed.published == 1)
        assert feed.loaded("replica-a") == 0  # not taken back by the restart's empty state
        # the replica reconnects saying what it serves, then loads and acknowledges 1
        replica = client.watch("replica-a", after_version=0, loaded_version=0)
        assert (await anext(replica)).manifest.version == 1
        await client.ack_loaded("replica-a", 1)
        await pushed(feed, lambda: feed.loaded("replica-a") == 1)
        await replica.aclose()
    finally:
        following.cancel()
        await client.close()
        await server.stop()
