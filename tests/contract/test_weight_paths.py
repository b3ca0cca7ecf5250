"""The filesystem and stream paths end to end: the real trainer publisher, the real
weight-sync service, the real replica watcher and native engine, all in-process.

What the engine is handed (`update_weights`) is recorded and compared bit for bit with
what the trainer published; a version corrupted after registration is refused and the
replica keeps serving the previous one; a replica started late converges to the newest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.inference.reload import WeightWatcher
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import write_version
from tidal.weightsync.config import FilesystemTransport, StreamTransport

from ..helpers.waiting import until

ARGS = DecoderArgs(
    vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64
)


def weights(version: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(version)
    model = DecoderLM(ARGS)
    model.init_weights(std=0.3)
    return {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}


@pytest.fixture(params=["filesystem", "stream"])
async def weightsync(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    span_exporter: InMemorySpanExporter,
    start_weightsync: Any,
) -> AsyncIterator[tuple[str, Path]]:
    transport = FilesystemTransport() if request.param == "filesystem" else StreamTransport()
    service = await start_weightsync(tmp_path / "weights", transport=transport, chunk_bytes=4096)
    yield service.address, service.root
    span_exporter.clear()  # other tests look up load spans by version number


async def test_published_weights_reach_the_engine_bit_identical(
    weightsync: tuple[str, Path], tmp_path: Path, recording_engine: Any
) -> None:
    address, root = weightsync
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    # A stream trainer has no shared folder: its own folder must stay untouched.
    trainer_dir = (
        root
        if (await client.join_sync("t", "trainer")).transport == "filesystem"
        else tmp_path / "private"
    )
    publisher = WeightPublisher(trainer_dir, client, ARGS.to_hf_config())
    engine = recording_engine()
    await engine.start()
    watcher = WeightWatcher(client, engine, "replica")
    task = asyncio.create_task(watcher.run())
    try:
        for version in range(3):
            await publisher.publish(version, weights(version))
            await until(lambda v=version: watcher.acked == v, f"version {version} not loaded")
        for version in range(3):
            sent, handed = weights(version), engine.handed[version]
            assert handed.keys() == sent.keys()
            assert all(torch.equal(handed[k], sent[k]) for k in sent)
        assert engine.policy_version == 2
        if trainer_dir != root:
            assert not trainer_dir.exists()
    finally:
        task.cancel()
        await engine.close()
        await client.close()


async def test_corrupt_version_is_refused_and_late_replica_converges(
    weightsync: tuple[str, Path], recording_engine: Any
) -> None:
    address, root = weightsync
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    publisher = WeightPublisher(root, client, ARGS.to_hf_config())
    engine = recording_engine()
    await engine.start()
    watcher = WeightWatcher(client, engine, "replica")
    task = asyncio.create_task(watcher.run())
    late_engine = recording_engine()
    await late_engine.start()
    late_task: asyncio.Task[None] | None = None
    try:
        await publisher.publish(0, weights(0))
        await until(lambda: watcher.acked == 0, "version 0 not loaded")
        # Version 1 is registered intact, then a shard is damaged on disk (bit rot, a bad
        # copy) before the replica reads it: refused, and version 0 keeps serving.
        manifest = write_version(
            root, version=1, step=1, state_dict=weights(1), config=ARGS.to_hf_config()
        )
        shard = Path(manifest.location) / "model.safetensors"
        await client.publish(manifest)
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x40
        shard.write_bytes(bytes(data))
        await until(lambda: watcher.skipped == [1], "corrupt version 1 not refused")
        assert engine.policy_version == 0 and 1 not in engine.handed
        for version in (2, 3):
            await publisher.publish(version, weights(version))
        await until(lambda: watcher.acked == 3, "version 3 not loaded")
        # A replica starting now goes straight to the newest version.
        late = WeightWatcher(client, late_engine, "late")
        late_task = asyncio.create_task(late.run())
        await until(lambda: late.acked == 3, "late replica did not converge")
        assert list(late_engine.handed) == [3]
        assert all(torch.equal(late_engine.handed[3][k], v) for k, v in weights(3).items())
    finally:
        task.cancel()
        if late_task is not None:
            late_task.cancel()
        await engine.close()
        await late_engine.close()
        await client.close()


async def test_companion_files_reach_weightsyncs_root_verified_on_either_path(
    weightsync: tuple[str, Path], tmp_path: Path, recording_engine: Any
) -> None:
    """Versions are complete model folders (tokenizer files, generation config) whichever
    path carried them, and the replica still loads them."""
    address, root = weightsync
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    trainer_dir = (
        root
        if (await client.join_sync("t", "trainer")).transport == "filesystem"
        else tmp_path / "private"
    )
    files = {"tokenizer.json": b'{"version": "1.0"}', "generation_config.json": b"{}"}
    publisher = WeightPublisher(trainer_dir, client, ARGS.to_hf_config(), files=files)
    engine = recording_engine()
    await engine.start()
    watcher = WeightWatcher(client, engine, "replica")
    task = asyncio.create_task(watcher.run())
    try:
        manifest = await publisher.publish(0, weights(0))
        await until(lambda: watcher.acked == 0, "version 0 not loaded")
        stored = root / "v000000"
        assert all((stored / name).read_bytes() == data for name, data in files.items())
        assert set(files) <= {f.path for f in manifest.files}
    finally:
        task.cancel()
        await engine.close()
        await client.close()


async def test_a_fresh_replica_whose_newest_version_is_corrupt_serves_the_previous_one(
    weightsync: tuple[str, Path], recording_engine: Any
) -> None:
    """A replica that serves nothing yet falls back to the newest older version
    that verifies, instead of waiting NOT_SERVING for a next publish."""
    address, root = weightsync
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    publisher = WeightPublisher(root, client, ARGS.to_hf_config())
    engine = recording_engine()
    await engine.start()
    task: asyncio.Task[None] | None = None
    try:
        for version in (0, 1, 2):
            await publisher.publish(version, weights(version))
        shard = Path((await client.latest()).manifest.location) / "model.safetensors"  # type: ignore[union-attr]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x40  # version 2 rots on disk after it was registered
        shard.write_bytes(bytes(data))
        watcher = WeightWatcher(client, engine, "fresh")
        task = asyncio.create_task(watcher.run())
        await until(lambda: watcher.acked == 1, "the fresh replica did not fall back to 1")
        assert watcher.skipped == [2] and list(engine.handed) == [1]
        assert all(torch.equal(engine.handed[1][k], v) for k, v in weights(1).items())
        await publisher.publish(3, weights(3))  # and it follows new versions as usual
        await until(lambda: watcher.acked == 3, "version 3 not loaded after the fallback")
    finally:
        if task is not None:
            task.cancel()
        await engine.close()
        await client.close()
