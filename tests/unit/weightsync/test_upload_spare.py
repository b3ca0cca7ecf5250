"""An upload writes over the weights file of a retired version, in place, and still verifies."""

from __future__ import annotations

from pathlib import Path

import torch

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.weights.client import WeightSyncClient
from tidal.weights.codec import decode_version, encode_version
from tidal.weights.folder import version_dir
from tidal.weights.manifest import WEIGHTS_FILE
from tidal.weightsync.config import StreamTransport
from tidal.weightsync.upload import SPARE_DIR


def weights(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g), "b": torch.randn(64, generator=g)}


async def upload(client: WeightSyncClient, version: int, state: dict[str, torch.Tensor]) -> None:
    manifest, files = encode_version(version=version, step=version, state_dict=state, config={})
    assert await client.upload(manifest, files, chunk_bytes=1 << 14) == version


async def test_retired_weights_file_is_written_over_by_the_next_upload(
    tmp_path: Path,
    start_weightsync,  # type: ignore[no-untyped-def]
) -> None:
    server = await start_weightsync(tmp_path / "w", transport=StreamTransport(), keep_last=1)
    client = WeightSyncClient(server.address, security=PLAINTEXT_LOOPBACK)
    await upload(client, 0, weights(1 << 15, 0))
    retired = (version_dir(server.root, 0) / WEIGHTS_FILE).stat().st_ino
    await upload(client, 1, weights(1 << 15, 1))  # retires version 0: its file is the spare
    assert not version_dir(server.root, 0).exists()
    assert (server.root / SPARE_DIR / WEIGHTS_FILE).stat().st_ino == retired
    smaller = weights(1 << 14, 2)  # a shorter file over the longer spare
    await upload(client, 2, smaller)
    written = version_dir(server.root, 2) / WEIGHTS_FILE
    assert written.stat().st_ino == retired
    manifest = (await client.latest()).manifest  # type: ignore[union-attr]
    assert written.stat().st_size == next(f.size for f in manifest.files if f.path == WEIGHTS_FILE)
    _, received = decode_version(await client.fetch_files(manifest))
    assert all(torch.equal(received[k], v) for k, v in smaller.items())
    await client.close()
