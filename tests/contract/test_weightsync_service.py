"""WeightSyncService over a real in-process gRPC server: every RPC, good and bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tidal.common.errors import DiskFull
from tidal.common.grpc.channel import make_channel
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.rpc.v1 import weightsync_pb2_grpc as pb_grpc
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import write_version
from tidal.weights.manifest import WeightManifest
from tidal.weights.wire import manifest_to_proto
from tidal.weightsync.config import StreamTransport

from ..helpers.small_disk import small_disk


@pytest.fixture
async def stream_weightsync(tmp_path: Path, start_weightsync):  # type: ignore[no-untyped-def]
    """The stream transport: the only one that accepts UploadWeights."""
    return await start_weightsync(tmp_path / "weights", transport=StreamTransport())


def publish_files(root: Path, version: int) -> WeightManifest:
    tensors = {"w": torch.full((8,), float(version))}
    return write_version(root, version=version, step=version, state_dict=tensors, config={})


async def test_publish_get_list_and_ack(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
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
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
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


async def test_watch_loaded_replays_the_state_then_pushes_each_change(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    await client.publish(publish_files(weightsync_server.root, 0))
    replica = client.watch("replica-a", after_version=-1)
    await anext(replica)  # registered
    states = client.watch_loaded()
    first = await asyncio.wait_for(anext(states), 10)
    assert (first.published, first.replicas) == (0, {"replica-a": -1})
    await client.ack_loaded("replica-a", 0)
    acked = await asyncio.wait_for(anext(states), 10)
    assert acked.replicas == {"replica-a": 0}
    await client.publish(publish_files(weightsync_server.root, 1))
    published = await asyncio.wait_for(anext(states), 10)
    assert (published.published, published.replicas) == (1, {"replica-a": 0})
    await client.close()


async def test_a_watch_naming_its_loaded_version_counts_as_acknowledged(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    await client.publish(publish_files(weightsync_server.root, 0))
    await client.publish(publish_files(weightsync_server.root, 1))
    # a replica reconnecting to a restarted weightsync: it serves version 1 already
    stream = client.watch("replica-a", after_version=1, loaded_version=1)
    pending = asyncio.create_task(anext(stream))
    states = client.watch_loaded()
    state = await asyncio.wait_for(anext(s async for s in states if "replica-a" in s.replicas), 10)
    assert state.replicas == {"replica-a": 1}
    listed = await client.list_versions()
    assert [v.loaded_by for v in listed] == [(), ("replica-a",)]
    pending.cancel()
    await client.close()


async def test_version_not_greater_is_refused_and_nothing_lost(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
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
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    manifest = publish_files(weightsync_server.root, 0)
    (Path(manifest.location) / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.publish(manifest)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "model.safetensors" in err.value.details()
    assert await client.latest() is None
    await client.close()


async def test_unknown_replica_ack_is_refused(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
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
        (lambda m: setattr(m, "location", str(Path(m.location).parent)), "manifest.location"),
        (lambda m: setattr(m, "location", f"{m.location}/.."), "manifest.location"),
        (lambda m: setattr(m, "version", 1), "manifest.location"),  # v000000 is not v1's
        (lambda m: setattr(m, "format", "pickle"), "manifest.format"),
        (lambda m: setattr(m.files[0], "path", "../x"), "manifest.files[0].path"),
        (lambda m: setattr(m.files[0], "sha256", "abc"), "manifest.files[0].sha256"),
        (lambda m: m.ClearField("files"), "manifest.files"),
        (lambda m: setattr(m, "version", -2), "manifest.version"),
        # LoRA adapters must apply to an older version (version 0 has none).
        (lambda m: setattr(m, "format", "lora-adapters"), "manifest.base_version"),
    ],
)
async def test_malformed_manifest_names_field(weightsync_server, mutate, field) -> None:  # type: ignore[no-untyped-def]
    manifest = manifest_to_proto(publish_files(weightsync_server.root, 0))
    mutate(manifest)
    async with make_channel(weightsync_server.address, security=PLAINTEXT_LOOPBACK) as channel:
        stub = pb_grpc.WeightSyncServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Publish(pb.PublishRequest(manifest=manifest), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(field)
        # still serving
        await stub.ListVersions(pb.ListVersionsRequest(), timeout=10)


async def test_fetch_weights_streams_chunks_and_resumes(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
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
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
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


async def test_health_and_reflection_when_enabled(tmp_path, start_weightsync) -> None:  # type: ignore[no-untyped-def]
    # Reflection is off by default (test_transport_security); `security.reflection` enables it.
    security = dataclasses.replace(PLAINTEXT_LOOPBACK, reflection=True)
    weightsync_server = await start_weightsync(tmp_path / "weights", security=security)
    async with make_channel(weightsync_server.address, security=PLAINTEXT_LOOPBACK) as channel:
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

    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    for v in range(2):
        await client.publish(publish_files(weightsync_server.root, v))
    await client.close()
    recovered = VersionRegistry(weightsync_server.root, keep_last=3)
    assert [e.manifest.version for e in recovered.all()] == [0, 1]


def state(seed: int, numel: int = 30_000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "emb": torch.randn(numel, generator=g).to(torch.bfloat16),
        "norm": torch.randn(7, generator=g),
    }


async def test_upload_then_fetch_is_bit_identical_and_resumable(stream_weightsync) -> None:  # type: ignore[no-untyped-def]
    from tidal.weights.codec import decode_version, encode_version

    client = WeightSyncClient(stream_weightsync.address, security=PLAINTEXT_LOOPBACK)
    sent = state(0)
    manifest, files = encode_version(version=0, step=0, state_dict=sent, config={"a": 1})
    assert await client.upload(manifest, files, chunk_bytes=5000) == 0
    registered = (await client.latest()).manifest  # type: ignore[union-attr]
    assert registered.files == manifest.files
    assert Path(registered.location) == stream_weightsync.root / "v000000"
    config, received = decode_version(await client.fetch_files(registered))
    assert config == {"a": 1}
    assert all(torch.equal(received[k], v) for k, v in sent.items())
    # A fetch resumed mid-file (what fetch_files does after a broken stream) gets the rest.
    stub = pb_grpc.WeightSyncServiceStub(client.channel)
    resume = pb.FetchWeightsRequest(version=0, path="model.safetensors", offset=12_345)
    rest = b"".join(
        [c.data async for c in stub.FetchWeights(resume) if c.path == "model.safetensors"]
    )
    assert rest == files["model.safetensors"][12_345:]
    await client.close()


async def test_upload_with_wrong_checksum_is_refused_and_nothing_lost(stream_weightsync) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from tidal.weights.codec import encode_version

    client = WeightSyncClient(stream_weightsync.address, security=PLAINTEXT_LOOPBACK)
    good, good_files = encode_version(version=0, step=0, state_dict=state(0), config={})
    await client.upload(good, good_files, chunk_bytes=1 << 16)
    manifest, files = encode_version(version=1, step=1, state_dict=state(1), config={})
    tampered = dict(files)
    data = bytearray(tampered["model.safetensors"])
    data[100] ^= 0x01
    tampered["model.safetensors"] = bytes(data)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.upload(manifest, tampered, chunk_bytes=1 << 16)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "model.safetensors arrived with" in err.value.details()
    stale = replace(manifest, version=0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.upload(stale, files, chunk_bytes=1 << 16)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not greater than the newest published version 0" in err.value.details()
    assert [v.manifest.version for v in await client.list_versions()] == [0]
    assert sorted(p.name for p in stream_weightsync.root.iterdir()) == ["v000000"]
    await client.close()


async def test_malformed_upload_streams_name_the_field(stream_weightsync) -> None:  # type: ignore[no-untyped-def]
    from tidal.weights.codec import encode_version

    manifest, _ = encode_version(version=0, step=0, state_dict=state(0), config={})
    header = pb.UploadWeightsRequest(manifest=manifest_to_proto(manifest))

    def chunk(path: str, offset: int) -> pb.UploadWeightsRequest:
        return pb.UploadWeightsRequest(chunk=pb.WeightChunk(path=path, offset=offset, data=b"x"))

    cases = [
        ([chunk("model.safetensors", 0)], "item"),
        ([header, chunk("other", 0)], "chunk.path"),
        ([header, chunk("model.safetensors", 9)], "chunk.offset"),
    ]
    async with make_channel(stream_weightsync.address, security=PLAINTEXT_LOOPBACK) as channel:
        stub = pb_grpc.WeightSyncServiceStub(channel)
        for messages, field in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.UploadWeights(iter(messages), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith(field)
    assert list(stream_weightsync.root.iterdir()) == []  # no folder, not even a temp one
    # The location is weightsync's to choose: an uploader may leave it empty.
    bare = manifest_to_proto(manifest)
    bare.location = ""
    messages = [pb.UploadWeightsRequest(manifest=bare)]
    client = WeightSyncClient(stream_weightsync.address, security=PLAINTEXT_LOOPBACK)
    _, files = encode_version(version=0, step=0, state_dict=state(0), config={})
    messages += [
        pb.UploadWeightsRequest(chunk=pb.WeightChunk(path=name, offset=0, data=bytes(data)))
        for name, data in files.items()
    ]
    reply = await pb_grpc.WeightSyncServiceStub(client.channel).UploadWeights(iter(messages))
    assert reply.version == 0
    await client.close()


async def test_upload_is_refused_unless_the_stream_transport_is_in_use(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    """A filesystem (or broadcast) run never uploads: an upload is refused before a byte
    is read, and nothing is written."""
    manifest = publish_files(weightsync_server.root / "elsewhere", 0)
    async with make_channel(weightsync_server.address, security=PLAINTEXT_LOOPBACK) as channel:
        stub = pb_grpc.WeightSyncServiceStub(channel)
        header = pb.UploadWeightsRequest(manifest=manifest_to_proto(manifest))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.UploadWeights(iter([header]), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "weightsync.transport.type" in (err.value.details() or "")
    assert sorted(p.name for p in weightsync_server.root.iterdir()) == ["elsewhere"]
    assert (
        await WeightSyncClient(
            weightsync_server.address, security=PLAINTEXT_LOOPBACK
        ).list_versions()
        == []
    )


async def test_join_sync_reports_the_transport_and_checks_the_role(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    plan = await client.join_sync("replica-a", "replica")
    assert (plan.transport, plan.seat) == ("filesystem", None)
    stub = pb_grpc.WeightSyncServiceStub(client.channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.JoinSync(pb.JoinSyncRequest(member_id="x"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("role")
    await client.close()


async def test_retention_never_deletes_a_version_being_loaded(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    await client.publish(publish_files(weightsync_server.root, 0))
    await client.publish(publish_files(weightsync_server.root, 1))
    stream = client.watch("loading-replica", after_version=-1)
    assert (await anext(stream)).manifest.version == 0
    await client.begin_load("loading-replica", 1)  # a slow load of v1 starts
    for v in range(2, 6):
        await client.publish(publish_files(weightsync_server.root, v))
    assert [v.manifest.version for v in await client.list_versions()] == [1, 3, 4, 5]
    assert (weightsync_server.root / "v000001" / "model.safetensors").is_file()
    await client.ack_loaded("loading-replica", 1)  # now it serves v1: still kept
    await client.publish(publish_files(weightsync_server.root, 6))
    assert [v.manifest.version for v in await client.list_versions()] == [1, 4, 5, 6]
    with pytest.raises(grpc.aio.AioRpcError) as err:  # v0 is gone: load a newer one
        await client.begin_load("loading-replica", 0)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.begin_load("stranger", 6)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await client.close()


async def test_other_rpcs_are_answered_while_a_fetch_waits_on_a_slow_disk(
    weightsync_server,
) -> None:  # type: ignore[no-untyped-def]
    # A FIFO stands in for a file on a slow (network) filesystem: opening it waits for a
    # writer and reading it waits for data, as long as the test's writer thread decides.
    # FetchWeights must wait for it off the event loop, so GetVersion (the same server,
    # the same loop) is answered meanwhile; reading on the loop stalled every RPC.
    hold_s = 2.0
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    manifest = publish_files(weightsync_server.root, 0)
    await client.publish(manifest)
    weights = Path(manifest.location) / "model.safetensors"
    data = weights.read_bytes()
    weights.unlink()
    os.mkfifo(weights)
    opened = threading.Event()
    opened_at: list[float] = []

    def slow_disk() -> None:
        with weights.open("wb") as pipe:  # returns once the server opened it to read
            opened_at.append(time.monotonic())
            opened.set()
            time.sleep(hold_s)
            pipe.write(data)

    writer = threading.Thread(target=slow_disk, daemon=True)
    writer.start()
    fetching = asyncio.ensure_future(client.fetch_files(manifest))
    assert await asyncio.to_thread(opened.wait, 10), "FetchWeights never opened the file"
    latest = await client.latest(timeout=10)
    answered_s = time.monotonic() - opened_at[0]
    assert latest is not None and latest.manifest.version == 0
    assert answered_s < hold_s / 2, f"GetVersion waited {answered_s:.2f}s for the fetch's read"
    fetched = await asyncio.wait_for(fetching, 10)  # and the fetch itself completes, verified
    assert bytes(fetched["model.safetensors"]) == data
    writer.join(5)
    await client.close()


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
async def test_a_manifest_without_a_required_file_is_refused_naming_it(
    weightsync_server, missing: str
) -> None:  # type: ignore[no-untyped-def]
    manifest = manifest_to_proto(publish_files(weightsync_server.root, 0))
    kept = [f for f in manifest.files if f.path != missing]
    del manifest.files[:]
    manifest.files.extend(kept)
    async with make_channel(weightsync_server.address, security=PLAINTEXT_LOOPBACK) as channel:
        stub = pb_grpc.WeightSyncServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Publish(pb.PublishRequest(manifest=manifest), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("manifest.files") and missing in err.value.details()
    assert weightsync_server.registry.newest == -1


async def test_publish_at_the_weights_root_never_lets_retention_delete_it(
    start_weightsync, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The operator's case: a Publish whose location is the root itself is refused, so
    the served versions stay on disk however many versions retention removes later."""
    ws = await start_weightsync(tmp_path / "weights", keep_last=1)
    client = WeightSyncClient(ws.address, security=PLAINTEXT_LOOPBACK)
    served = publish_files(ws.root, 0)
    await client.publish(served)
    bogus = manifest_to_proto(publish_files(ws.root, 1))
    bogus.location = str(ws.root)
    async with make_channel(ws.address, security=PLAINTEXT_LOOPBACK) as channel:
        stub = pb_grpc.WeightSyncServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Publish(pb.PublishRequest(manifest=bogus), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("manifest.location")
    await client.publish(publish_files(ws.root, 2))  # retention now drops version 0 only
    assert not Path(served.location).exists()
    assert (ws.root / "v000002" / "config.json").is_file()
    assert [v.manifest.version for v in await client.list_versions()] == [2]
    await client.close()


async def test_a_recovered_manifest_naming_the_root_only_ever_costs_its_own_folder(
    start_weightsync, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A manifest written before locations were checked may name the root itself; after a
    restart, retention of that version deletes its own folder, never the root."""
    root = tmp_path / "weights"
    root.mkdir()
    old = publish_files(root, 0)
    bad = dataclasses.replace(old, location=str(root))
    (Path(old.location) / "manifest.json").write_text(bad.to_json())
    ws = await start_weightsync(root, keep_last=1)
    client = WeightSyncClient(ws.address, security=PLAINTEXT_LOOPBACK)
    await client.publish(publish_files(root, 1))  # retention drops version 0
    assert not Path(old.location).exists()
    assert (root / "v000001" / "model.safetensors").is_file()
    assert [v.manifest.version for v in await client.list_versions()] == [1]
    await client.close()


async def test_a_full_disk_during_an_upload_is_reported_disk_full(  # type: ignore[no-untyped-def]
    tmp_path: Path, start_weightsync
) -> None:
    """The uploader gets `DiskFull` naming weightsync and its folder, at once (no retry
    of a write that would fail alike), and nothing is registered."""
    from tidal.weights.codec import encode_version

    with small_disk(tmp_path / "disk", "256k") as disk:
        service = await start_weightsync(disk / "weights", transport=StreamTransport())
        client = WeightSyncClient(service.address, security=PLAINTEXT_LOOPBACK)
        manifest, files = encode_version(
            version=0, step=0, state_dict=state(0, numel=512 << 10), config={}
        )
        with pytest.raises(DiskFull, match=r"^weightsync at .*: disk full: ") as err:
            await client.upload(manifest, files, chunk_bytes=1 << 16)
        assert f"{disk / 'weights'}/" in str(err.value) and "could not be written" in str(err.value)
        assert await client.latest() is None
        await client.close()


async def test_an_upload_over_the_total_cap_is_refused_before_a_byte_is_written(  # type: ignore[no-untyped-def]
    tmp_path: Path, start_weightsync
) -> None:
    """A manifest whose files add up to more than `max_upload_bytes` is refused
    RESOURCE_EXHAUSTED naming `manifest.files`; no folder appears, not even a temp one."""
    from tidal.weights.codec import encode_version

    small, small_files = encode_version(version=0, step=0, state_dict=state(0), config={})
    cap = sum(f.size for f in small.files)
    service = await start_weightsync(
        tmp_path / "weights", transport=StreamTransport(max_upload_bytes=cap)
    )
    client = WeightSyncClient(service.address, security=PLAINTEXT_LOOPBACK)
    assert await client.upload(small, small_files, chunk_bytes=1 << 16) == 0  # at the cap
    big, big_files = encode_version(version=1, step=1, state_dict=state(1, numel=60_000), config={})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.upload(big, big_files, chunk_bytes=1 << 16)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = err.value.details() or ""
    assert details.startswith("manifest.files:") and "max_upload_bytes" in details, details
    assert sorted(p.name for p in service.root.iterdir()) == ["v000000"]
    assert [v.manifest.version for v in await client.list_versions()] == [0]
    await client.close()
