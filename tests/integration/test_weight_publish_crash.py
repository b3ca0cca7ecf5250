"""A trainer killed (SIGKILL) in the middle of a filesystem publish.

The trainer is a real process running the real `WeightPublisher` against a real
weight-sync server in the test process. It publishes version 0, then starts writing a
large version 1 and is killed while the file is being written. Version 0 must stay the
current one, nothing of version 1 may be visible, and the next publish of version 1
must succeed (the partial folder is swept).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import TMP_PREFIX, load_version
from tidal.weights.manifest import WEIGHTS_FILE
from tidal.weightsync.registry import VersionRegistry

TRAINER = """
import asyncio, sys
from pathlib import Path
import torch
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.weights.client import WeightSyncClient


async def main(address, root):
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    publisher = WeightPublisher(Path(root), client, {"model_type": "llama"})
    await publisher.publish(0, {"w": torch.full((4,), 7.0)})
    print("published 0", flush=True)
    await publisher.publish(1, {"w": torch.ones(32 << 20)})  # 128 MB: killed while writing

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def partial_file(root: Path) -> Path | None:
    for folder in root.glob(f"{TMP_PREFIX}*"):
        path = folder / WEIGHTS_FILE
        if path.is_file() and path.stat().st_size > 0:
            return path
    return None


@pytest.mark.slow
async def test_killed_publish_leaves_previous_version_current(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    root: Path = weightsync_server.root
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, weightsync_server.address, str(root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert trainer.stdout is not None  # the loop must keep serving the trainer's RPCs
        assert (await asyncio.to_thread(trainer.stdout.readline)).strip() == "published 0"
        deadline = time.monotonic() + 60
        while partial_file(root) is None:
            assert trainer.poll() is None, "the trainer finished before it could be killed"
            assert time.monotonic() < deadline, "version 1 was never being written"
            await asyncio.sleep(0.001)
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(10)
    finally:
        if trainer.poll() is None:
            trainer.kill()

    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    latest = await client.latest()
    assert latest is not None and latest.manifest.version == 0
    assert [v.manifest.version for v in await client.list_versions()] == [0]
    assert not (root / "v000001").exists()
    _, weights = load_version(latest.manifest)  # verifies sha256: still intact
    assert torch.equal(weights["w"], torch.full((4,), 7.0))
    # A restarted service sees the same; the next publish of version 1 goes through.
    assert [e.manifest.version for e in VersionRegistry(root, keep_last=3).all()] == [0]
    assert not list(root.glob(f"{TMP_PREFIX}*"))  # swept on start
    publisher = WeightPublisher(root, client, {"model_type": "llama"})
    await publisher.publish(1, {"w": torch.zeros(3)})
    assert (await client.latest()).manifest.version == 1  # type: ignore[union-attr]
    await client.close()
