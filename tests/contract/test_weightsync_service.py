"""WeightSyncService over a real in-process gRPC server: every RPC, good and bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tidal.common.channel import make_channel
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.rpc.v1 import weightsync_pb2_grpc as pb_grpc
from tidal.weightsync.client import WeightSyncClient
from tidal.weightsync.convert import manifest_to_proto
from tidal.weightsync.filesystem import write_version
from tidal.weightsync.manifest import WeightManifest


def publish_files(root: Path, version: int) -> WeightManifest:
    tensors = {"w": torch.full((8,), float(version))}
    return write_version(root, version=version, step=version, state_dict=tensors, config={})


async def test_publish_get_list_and_ack(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address)
    assert await client.latest() is None
    manifest = publish_files(weightsync_server.root, 0)
    assert await client.publish(manifest) == 0
    latest = await client.latest()
    assert latest is not None and latest.manifest == manifest
    watch = client.watch("replica-a", after_version=-1)
    first = await anext(watch)
    assert first.manifest.version == 0
    await client.ack_loaded("replica-a", 0)
    listed = await client.list_versions()
    assert [v.manifest.version for v in listed] == [0] and listed[0].loaded_by == ("replica-a",)
    await client.close()


async def test_watch_streams_new_versions_in_order(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address)
    await client.publish(publish_files(weightsync_server.root, 0))
    stream = client.watch("replica-a", after_version=0)
    pending = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.1)
    assert not pending.done()  # nothing newer yet: the stream waits
    await client.publish(publish_files(weightsync_server.root, 1))
    event = await asyncio.wait_for(pending, 10)
    assert event.manifest.version == 1
    assert event.trace_context.get("traceparent", "").startswith("00-")
    await client.close()


async def test_version_not_greater_is_refused_and_nothing_lost(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address)
    m1 = publish_files(weightsync_server.root, 1)
    await client.publish(m1)
    m0 = publish_files(weightsync_server.root, 0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.publish(m0)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not greater than the newest published version 1" in err.value.details()
    assert (await client.latest()).manifest == m1  # type: ignore[union-attr]
    await client.close()


async def test_checksum_mismatch_is_refused(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address)
    manifest = publish_files(weightsync_server.root, 0)
    (Path(manifest.location) / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.publish(manifest)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "model.safetensors" in err.value.details()
    assert await client.latest() is None
    await client.close()


async def test_unknown_replica_ack_is_refused(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address)
    await client.publish(publish_files(weightsync_server.root, 0))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.ack_loaded("never-watched", 0)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unknown replica_id" in err.value.details()
    await client.close()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: setattr(m, "location", "/elsewhere"), "manifest.location"),
        (lambda m: setattr(m, "format", "pickle"), "manifest.format"),
        (lambda m: setattr(m.files[0], "path", "../x"), "manifest.files[0].path"),
        (lambda m: setattr(m.files[0], "sha256", "abc"), "manifest.files[0].sha256"),
        (lambda m: m.ClearField("files"), "manifest.files"),
        (lambda m: setattr(m, "version", -2), "manifest.version"),
    ],
)
async def test_malformed_manifest_names_field(weightsync_server, mutate, field) -> None:  # type: ignore[no-untyped-def]
    manifest = manifest_to_proto(publish_files(weightsync_server.root, 0))
    mutate(manifest)
    async with make_channel(weightsync_server.address) as channel:
        stub = pb_grpc.WeightSyncServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Publish(pb.PublishRequest(manifest=manifest), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(field)
        # still serving
        await stub.ListVersions(pb.ListVersionsRequest(), timeout=10)


async def test_fetch_weights_streams_chunks_and_resumes(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address)
    tensors = {"w": torch.randn(50_000)}  # ~200 kB: several 64 kB chunks
    manifest = write_version(
        weightsync_server.root, version=0, step=0, state_dict=tensors, config={}
    )
    await client.publish(manifest)
    stub = pb_grpc.WeightSyncServiceStub(client.channel)
    chunks = [c async for c in stub.FetchWeights(pb.FetchWeightsRequest(version=0))]
    assert len(chunks) > 2
    for f in manifest.files:
        data = b"".join(c.data for c in chunks if c.path == f.path)
        assert data == (Path(manifest.location) / f.path).read_bytes()
    resume = pb.FetchWeightsRequest(version=0, path="model.safetensors", offset=1000)
    rest = b"".join(
        [c.data async for c in stub.FetchWeights(resume) if c.path == "model.safetensors"]
    )
    assert rest == (Path(manifest.location) / "model.safetensors").read_bytes()[1000:]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [c async for c in stub.FetchWeights(pb.FetchWeightsRequest(version=7))]
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await client.close()


async def test_retention_keeps_last_k_and_versions_in_use(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address)
    await client.publish(publish_files(weightsync_server.root, 0))
    stream = client.watch("slow-replica", after_version=-1)
    await anext(stream)
    await client.ack_loaded("slow-replica", 0)
    for v in range(1, 6):
        await client.publish(publish_files(weightsync_server.root, v))
    kept = [v.manifest.version for v in await client.list_versions()]
    assert kept == [0, 3, 4, 5]  # keep_last=3, plus v0 which slow-replica still serves
    assert sorted(p.name for p in weightsync_server.root.iterdir()) == [
        "v000000", "v000003", "v000004", "v000005",
    ]  # fmt: skip
    await client.close()


async def test_health_and_reflection(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    async with make_channel(weightsync_server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(
            health_pb2.HealthCheckRequest(service="tidal.rpc.v1.WeightSyncService"), timeout=10
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        replies = [r async for r in reflection.ServerReflectionInfo(iter([request]))]
        names = {s.name for s in replies[0].list_services_response.service}
        assert {"tidal.rpc.v1.WeightSyncService", "grpc.health.v1.Health"} <= names


async def test_restarted_registry_recovers_versions(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    from tidal.weightsync.registry import VersionRegistry

    client = WeightSyncClient(weightsync_server.address)
    for v in range(2):
        await client.publish(publish_files(weightsync_server.root, v))
    await client.close()
    recovered = VersionRegistry(weightsync_server.root, keep_last=3)
    assert [e.manifest.version for e in recovered.all()] == [0, 1]
