"""The orchestrator's inference pool over real replicas: routing, retry, ride-out.

Two real inference services (what `serve` runs, in-process on free loopback ports) watch
one real weight-sync service that has a tiny model published; the pool under test is
the orchestrator's own (`InferencePool`). Stopping a replica's gRPC server is what a
dead or restarting replica looks like to the orchestrator (connection refused).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tidal.common.config.shared import Endpoints, GrpcConfig, RunSection, TelemetryConfig
from tidal.common.security.config import SecurityConfig
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.inference.config import InferenceConfig, InferenceRunConfig
from tidal.inference.main import RunningInference, start_inference
from tidal.orchestrator.config import InflightConfig
from tidal.orchestrator.peers.inference_client import ReplicaOccupancy
from tidal.orchestrator.peers.inference_pool import InferencePool
from tidal.orchestrator.peers.occupancy import STALE_S
from tidal.orchestrator.peers.peer_client import PeerError
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.weights.client import WeightSyncClient
from tidal.weights.manifest import LoadedVersions

from .test_inference_service import publish

PROMPT = list(b"abc")


def replica_config(
    ws: Any, tmp_path: Path, index: int, address: str, max_model_len: int | None = None
) -> InferenceRunConfig:
    return InferenceRunConfig(
        run=RunSection(output_dir=tmp_path, tokenizer="byte"),
        endpoints=Endpoints(weightsync=ws.address, inference=address),
        grpc=GrpcConfig(shutdown_grace_s=0.1),
        telemetry=TelemetryConfig(traces_file=False),
        security=SecurityConfig(mode="plaintext"),
        inference=InferenceConfig(
            device="cpu", replica_id=f"inference-{index}", max_model_len=max_model_len
        ),
    )


async def start_replica(
    ws: Any, tmp_path: Path, index: int, address: str, max_model_len: int | None = None
) -> RunningInference:
    return await start_inference(replica_config(ws, tmp_path, index, address, max_model_len))


async def stop_replica(running: RunningInference) -> None:
    await running.server.stop()
    await running.close()


@pytest.fixture
async def replicas(weightsync_server: Any, tmp_path: Path) -> AsyncIterator[list[Any]]:
    await publish(weightsync_server, 0)
    started = [await start_replica(weightsync_server, tmp_path, i, "127.0.0.1:0") for i in range(2)]
    yield started
    for running in started:
        await stop_replica(running)


@pytest.fixture
async def versions(weightsync_server: Any) -> AsyncIterator[VersionFeed]:
    """The orchestrator's feed of loaded versions, following the real weight-sync service."""
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    feed = VersionFeed()
    following = asyncio.create_task(feed.follow(client))
    yield feed
    following.cancel()
    await client.close()


async def generate(
    pool: InferencePool, seed: int = 1, n: int = 2, affinity: str = "", max_tokens: int = 8
) -> list[Any]:
    return await pool.generate(
        PROMPT,
        n=n,
        max_tokens=max_tokens,
        temperature=1.0,
        top_p=1.0,
        seed=seed,
        stop_token_ids=[],
        request_id=f"r{seed}",
        timeout=30,
        affinity=affinity,
    )


async def test_least_outstanding_work_chooses_the_emptiest_serving_replica() -> None:
    # grpc.aio channels (never connected here) need the running loop
    pool = InferencePool(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], security=PLAINTEXT_LOOPBACK)
    a, b, c = pool.replicas
    a.outstanding_tokens, b.outstanding_tokens, c.outstanding_tokens = 50, 10, 30
    assert pool.choose() is b
    b.serving = False
    assert pool.choose() is c  # the emptiest of those that serve
    c.outstanding_tokens = a.outstanding_tokens
    a.sent, c.sent = 3, 1
    assert pool.choose() is c  # equal work: fewer requests sent
    a.serving = c.serving = False
    assert pool.choose() is None
    await pool.close()


async def test_affinity_keeps_a_key_on_its_replica_while_it_serves() -> None:
    # grpc.aio channels (never connected here) need the running loop
    pool = InferencePool(["127.0.0.1:1", "127.0.0.1:2"], security=PLAINTEXT_LOOPBACK)
    a, b = pool.replicas
    a.outstanding_tokens = 100
    assert pool.choose("group-1") is b  # a new key: least outstanding work
    pool.remember("group-1", b)
    b.outstanding_tokens = 500
    assert pool.choose("group-1") is b  # its next turn stays with its cached prefix
    assert pool.choose("group-2") is a  # other keys still balance
    b.serving = False
    assert pool.choose("group-1") is a  # its replica is gone: anywhere that serves
    await pool.close()


def pushed(queued: int, kv_usage: float, age_s: float = 0.0) -> ReplicaOccupancy:
    return ReplicaOccupancy(queued, 1, kv_usage, received_at=time.monotonic() - age_s)


async def test_a_replica_past_the_targets_is_chosen_last_and_stale_reports_count_as_none() -> None:
    # grpc.aio channels (never connected here) need the running loop
    targets = InflightConfig(queue_target=4, kv_usage_target=0.9)
    pool = InferencePool(
        ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], security=PLAINTEXT_LOOPBACK, inflight=targets
    )
    a, b, c = pool.replicas
    assert pool.pressure() is None  # nobody has reported: routing by outstanding work
    a.outstanding_tokens, b.outstanding_tokens, c.outstanding_tokens = 10, 20, 30
    a.occupancy = pushed(queued=9, kv_usage=0.1)  # others' load queues up there
    b.occupancy = pushed(queued=0, kv_usage=0.95)  # its KV cache is full
    assert pool.choose() is c  # not reported: within the targets
    c.occupancy = pushed(queued=2, kv_usage=0.5)
    assert pool.choose() is c
    assert pool.pressure() == (9, 0.95)  # the longest queue, the fullest cache
    c.serving = False
    assert pool.choose() is a  # all past their targets: least outstanding work again
    a.occupancy = pushed(queued=9, kv_usage=0.1, age_s=STALE_S + 1)  # a stalled stream
    assert pool.choose() is a and pool.pressure() == (0, 0.95)
    await pool.close()


async def test_replicas_push_occupancy_that_drives_the_bound_and_returns_after_a_restart(
    replicas: list[RunningInference],
    weightsync_server: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[int, float]] = []

    async def on_pressure(queued: int, kv_usage: float) -> None:
        seen.append((queued, kv_usage))

    address = f"127.0.0.1:{replicas[0].port}"
    pool = InferencePool(
        [address, f"127.0.0.1:{replicas[1].port}"],
        security=PLAINTEXT_LOOPBACK,
        probe_s=0.1,
        on_pressure=on_pressure,
    )

    async def until(check: Any, what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    caplog.set_level(logging.INFO, logger="tidal.orchestrator.peers.occupancy")
    try:
        await pool.wait_serving(30)
        first, second = pool.replicas
        await until(lambda: first.occupancy and second.occupancy, "no replica reported")
        assert pool.pressure() == (0, 0.0) and seen[-1] == (0, 0.0)  # idle replicas
        # generations hold KV blocks while they run (a few tenths of a second): pushed
        calls = (generate(pool, seed=s, n=4, max_tokens=60) for s in range(8))
        busy = asyncio.gather(*calls)
        await until(lambda: max(k for _, k in seen) > 0, "no busy figures were pushed")
        await busy
        await until(lambda: pool.pressure() == (0, 0.0), "the freed cache was not pushed")
        # the replica stops: its stream is gone, the other one's figures still count
        await stop_replica(replicas[0])
        await until(lambda: first.occupancy is None, "a lost stream kept its figures")
        assert pool.pressure() is not None
        # it restarts on its address, under a new id, between two calls (nothing failed):
        # the pool reopens the stream and re-reads the id its version gate counts by
        config = replica_config(weightsync_server, tmp_path, 0, address)
        config.inference.replica_id = "inference-0-restarted"
        replicas[0] = await start_inference(config)
        await until(lambda: first.occupancy is not None, "the stream was not reopened")
        await until(lambda: first.replica_id == "inference-0-restarted", "the id was not re-read")
        assert first.serving
        assert f"inference at {address}: occupancy stream lost" in caplog.text
        assert f"inference at {address}: occupancy stream reopened" in caplog.text
        assert "cannot watch" not in caplog.text
    finally:
        await pool.close()


async def test_the_version_gate_is_the_oldest_pushed_version_of_the_serving_replicas() -> None:
    # grpc.aio channels (never connected here) need the running loop
    feed = VersionFeed()
    pool = InferencePool(["127.0.0.1:1", "127.0.0.1:2"], security=PLAINTEXT_LOOPBACK, versions=feed)
    a, b = pool.replicas
    a.replica_id, b.replica_id = "inference-0", "inference-1"
    feed.apply(LoadedVersions(1, {"inference-0": 1, "inference-1": 0}))
    waiting = asyncio.create_task(pool.wait_loaded(1))
    await asyncio.sleep(0.05)
    assert pool.loaded_version() == 0 and not waiting.done()  # inference-1 lags
    await pool._lost(b, "killed")  # a replica that is down does not hold the run back
    assert await asyncio.wait_for(waiting, 5) == 1
    await pool.close()


async def test_requests_spread_over_both_replicas_and_versions_gate_on_the_oldest(
    replicas: list[RunningInference], versions: VersionFeed
) -> None:
    pool = InferencePool(
        [f"127.0.0.1:{r.port}" for r in replicas],
        security=PLAINTEXT_LOOPBACK,
        probe_s=0.1,
        versions=versions,
    )
    try:
        await pool.wait_serving(30)
        results = await asyncio.gather(*(generate(pool, seed=s) for s in range(8)))
        assert all(len(r) == 2 and all(c.token_ids for c in r) for r in results)
        assert [r.served for r in pool.replicas] == [4, 4]  # concurrent: kept level
        assert all(r.outstanding_tokens == 0 for r in pool.replicas)
        assert await pool.policy_version() == 0
        assert all(v == 0 for c in results[0] for v in c.policy_versions)
    finally:
        await pool.close()


async def test_concurrent_calls_of_one_affinity_key_go_to_one_replica(
    replicas: list[RunningInference],
) -> None:
    pool = InferencePool(
        [f"127.0.0.1:{r.port}" for r in replicas], security=PLAINTEXT_LOOPBACK, probe_s=0.1
    )
    try:
        await pool.wait_serving(30)
        await asyncio.gather(*(generate(pool, seed=s, affinity="group-a") for s in range(4)))
        assert sorted(r.served for r in pool.replicas) == [0, 4]  # a group's first turns
        await asyncio.gather(*(generate(pool, seed=s, affinity="group-b") for s in range(4)))
        assert [r.served for r in pool.replicas] == [4, 4]  # the next group: the other one
    finally:
        await pool.close()


async def test_a_failed_replica_is_retried_elsewhere_and_used_again_when_it_returns(
    replicas: list[RunningInference],
    weightsync_server: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    address = f"127.0.0.1:{replicas[0].port}"
    pool = InferencePool(
        [address, f"127.0.0.1:{replicas[1].port}"], security=PLAINTEXT_LOOPBACK, probe_s=2.0
    )
    try:
        await pool.wait_serving(30)
        first, second = pool.replicas
        await stop_replica(replicas[0])  # the pool has not noticed yet: it tries it first
        caplog.set_level(logging.INFO, logger="tidal.orchestrator.peers.inference_pool")
        result = await generate(pool)
        assert len(result) == 2 and [c.index for c in result] == [0, 1]
        assert (first.failed, first.served, second.served) == (1, 0, 1)
        assert not first.serving and f"replica 0 at {address} lost" in caplog.text
        # it comes back on the same address (a restart): the probe puts it back in use
        replicas[0] = await start_replica(weightsync_server, tmp_path, 0, address)
        deadline = time.monotonic() + 15
        while not first.serving:
            assert time.monotonic() < deadline, "the returned replica was not seen"
            await asyncio.sleep(0.05)
        await asyncio.gather(*(generate(pool, seed=s) for s in range(4)))
        assert first.served >= 1
    finally:
        await pool.close()


async def test_one_replica_lost_is_waited_for_then_fails_clearly(
    weightsync_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await publish(weightsync_server, 0)
    running = await start_replica(weightsync_server, tmp_path, 0, "127.0.0.1:0")
    address = f"127.0.0.1:{running.port}"
    pool = InferencePool([address], security=PLAINTEXT_LOOPBACK, probe_s=0.1, lost_timeout_s=60)
    try:
        await pool.wait_serving(30)
        await stop_replica(running)
        caplog.set_level(logging.WARNING, logger="tidal.orchestrator.peers.inference_pool")
        while pool.replicas[0].serving:  # the probe notices (a call would notice too)
            await asyncio.sleep(0.05)
        waiting = asyncio.create_task(generate(pool))
        await asyncio.sleep(1.0)
        assert not waiting.done()  # waiting for the replica, not failing the run
        running = await start_replica(weightsync_server, tmp_path, 0, address)
        result = await asyncio.wait_for(waiting, 30)
        assert len(result) == 2
        assert f"no inference replica serves ({address}" in caplog.text
        # now gone for good, with a short bound: a clear error naming the key
        await stop_replica(running)
        pool.lost_timeout_s = 1.0
        with pytest.raises(PeerError, match=r"orchestrator\.recovery\.peer_loss_s") as err:
            await generate(pool)
        assert address in str(err.value)
    finally:
        await pool.close()


async def test_the_pool_knows_the_smallest_context_length_of_its_replicas(
    weightsync_server: Any, tmp_path: Path
) -> None:
    await publish(weightsync_server, 0)
    short = await start_replica(weightsync_server, tmp_path, 0, "127.0.0.1:0", max_model_len=48)
    full = await start_replica(weightsync_server, tmp_path, 1, "127.0.0.1:0")
    pool = InferencePool(
        [f"127.0.0.1:{short.port}", f"127.0.0.1:{full.port}"], security=PLAINTEXT_LOOPBACK
    )
    try:
        assert pool.max_seq_len is None  # nothing read yet
        await pool.wait_serving(30)
        assert short.engine.max_seq_len == 48 < full.engine.max_seq_len
        # an episode's next turn may go to either replica: it must fit the shorter one
        assert pool.max_seq_len == 48
        assert [r.max_seq_len for r in pool.replicas] == [48, full.engine.max_seq_len]
    finally:
        await pool.close()
        for running in (short, full):
            await stop_replica(running)
