"""Weightsync as a real process (`python -m tidal.weightsync`): what survives a restart.

- On start it adopts only versions whose every file verifies against the manifest: a
  half-written version and a stray `v<N>` folder without a manifest are removed.
- Publish is idempotent: a trainer whose Publish was cut by a weightsync SIGKILL re-sends
  the same manifest to the restarted service and gets OK; the same version with other
  content is refused.
- Replica registrations are leases: a replica whose Watch stream is gone stops pinning
  its version once `lease_s` has passed.
- A SIGTERM ends the open Watch and WatchLoaded streams cleanly at once: watchers do not
  hold the stopping service for its grace period.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import tomli_w
import torch

from tidal.cli.ports import free_port
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import version_dir, write_version
from tidal.weights.manifest import MANIFEST_FILE, WEIGHTS_FILE, WeightManifest

LEASE_S = 1.0


class WeightSyncProcess:
    def __init__(self, tmp_path: Path, *, shutdown_grace_s: float = 5.0) -> None:
        self.run_dir = tmp_path / "outputs" / "ws"
        self.root = self.run_dir / "weights"
        self.address = f"127.0.0.1:{free_port()}"
        config = {
            "run": {"output_dir": str(tmp_path / "outputs"), "name": "ws"},
            "endpoints": {"weightsync": self.address},
            "weightsync": {"keep_last": 1, "lease_s": LEASE_S},
            "grpc": {"shutdown_grace_s": shutdown_grace_s},
            # Durability, not transport, is under test here: plaintext on loopback, asked.
            "security": {"mode": "plaintext"},
        }
        self.root.mkdir(parents=True)
        self.config = self.run_dir / "config.toml"
        self.config.write_text(tomli_w.dumps(config))
        self.log = self.run_dir / "weightsync.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidal.weightsync", "@", str(self.config)],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture
def weightsync(tmp_path: Path) -> Iterator[WeightSyncProcess]:
    service = WeightSyncProcess(tmp_path)
    yield service
    if service.process is not None and service.process.poll() is None:
        service.kill()


def files(root: Path, version: int) -> WeightManifest:
    return write_version(
        root, version=version, step=version, state_dict={"w": torch.full((64,), float(version))},
        config={"model_type": "llama"},
    )  # fmt: skip


async def versions(client: WeightSyncClient) -> list[int]:
    return [e.manifest.version for e in await client.list_versions(timeout=60)]


@pytest.mark.slow
async def test_restart_adopts_only_verified_versions_and_a_cut_publish_is_retried(
    weightsync: WeightSyncProcess,
) -> None:
    root = weightsync.root
    files(root, 1)
    torn = Path(files(root, 2).location) / WEIGHTS_FILE
    torn.write_bytes(torn.read_bytes()[:40])  # half-written: the manifest promises more
    stray = version_dir(root, 3)
    stray.mkdir()
    (stray / WEIGHTS_FILE).write_bytes(b"no manifest")
    unrelated = root / "notes.txt"
    unrelated.write_text("an operator's file")

    weightsync.start()
    client = WeightSyncClient(weightsync.address, security=PLAINTEXT_LOOPBACK)
    try:
        assert await versions(client) == [1]
        assert not version_dir(root, 2).exists() and not stray.exists()
        assert unrelated.read_text() == "an operator's file"  # only version folders go
        log = weightsync.log.read_text()
        assert "not serving v000002" in log and "manifest says" in log
        assert f"not serving v000003, removing it: {stray} has no {MANIFEST_FILE}" in log

        # A publish cut by a SIGKILL: the version is on disk (and was maybe registered);
        # the restarted service adopts it and the trainer's re-sent Publish succeeds.
        second = files(root, 2)
        assert await client.publish(second) == 2
        weightsync.kill()
        weightsync.start()
        assert await client.publish(second, timeout=60) == 2
        assert await client.publish(second) == 2  # and again: idempotent
        with pytest.raises(grpc.aio.AioRpcError) as err:  # same version, other content
            await client.publish(replace(second, step=7))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert await versions(client) == [2]  # keep_last = 1
    finally:
        await client.close()


@pytest.mark.slow
async def test_a_replica_that_stops_watching_stops_pinning_after_its_lease(
    weightsync: WeightSyncProcess,
) -> None:
    weightsync.start()
    client = WeightSyncClient(weightsync.address, security=PLAINTEXT_LOOPBACK)
    try:
        await client.publish(files(weightsync.root, 1), timeout=60)
        for replica, version in (("a", 1), ("b", 2)):  # a replica restarted under a new id
            stream = client.watch(replica, after_version=version - 1)
            assert (await anext(stream)).manifest.version == version
            await client.ack_loaded(replica, version)
            if version == 1:
                await client.publish(files(weightsync.root, 2))
                assert await versions(client) == [1, 2]  # a is watching: 1 stays pinned
            await stream.aclose()  # the replica goes away (its stream is cancelled)
        await client.publish(files(weightsync.root, 3))
        assert await versions(client) == [1, 2, 3]  # within the leases: still pinned
        await asyncio.sleep(LEASE_S + 0.5)
        await client.publish(files(weightsync.root, 4))
        assert await versions(client) == [4]  # both leases ran out: keep_last = 1
        assert not version_dir(weightsync.root, 1).exists()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.ack_loaded("a", 4)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "lease expired" in err.value.details()
    finally:
        await client.close()


@pytest.mark.slow
async def test_a_sigterm_ends_the_watch_streams_without_waiting_out_the_grace(
    tmp_path: Path,
) -> None:
    grace_s = 30.0
    service = WeightSyncProcess(tmp_path, shutdown_grace_s=grace_s)
    service.start()
    assert service.process is not None
    client = WeightSyncClient(service.address, security=PLAINTEXT_LOOPBACK)
    try:
        await client.publish(files(service.root, 1), timeout=60)
        versions_stream = client.watch("a", after_version=0)
        loaded_stream = client.watch_loaded()
        assert (await anext(versions_stream)).manifest.version == 1
        assert (await anext(loaded_stream)).published == 1
        started = asyncio.get_running_loop().time()
        service.process.send_signal(signal.SIGTERM)
        # Both streams end cleanly (no error status), then the process exits.
        assert [e async for e in versions_stream] == []
        assert [s async for s in loaded_stream] == []
        code = await asyncio.to_thread(service.process.wait, grace_s)
        assert asyncio.get_running_loop().time() - started < grace_s / 3
        assert code == 0
        log = service.log.read_text()
        assert "Traceback" not in log, log
    finally:
        await client.close()
        if service.process.poll() is None:
            service.kill()
