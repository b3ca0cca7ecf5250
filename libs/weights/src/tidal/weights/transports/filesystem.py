"""The filesystem transport: trainer and replicas share weightsync's root folder.

The sender writes the version folder atomically in a worker thread (`folder.stage_files`,
hashing while it writes) and registers it with `Publish`, which makes weightsync verify
it once; the receiver reads it with `folder.load_version`, hashing while it reads.
`stage` + `send_staged` split the write from the rename and registration, so the trainer
can write a version while its checkpoint is saved.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.common.files.safe_remove import remove_inside
from tidal.weights.codec import encode_files
from tidal.weights.folder import StagedVersion, load_version, stage_files, version_dir
from tidal.weights.manifest import WEIGHTS_FILE, WeightManifest
from tidal.weights.transports.base import VersionPayload, WeightReceiver, WeightSender

if TYPE_CHECKING:
    import torch

    from tidal.weights.client import WeightSyncClient


class FilesystemSender(WeightSender):
    def __init__(self, root: Path, client: WeightSyncClient) -> None:
        self.root = root
        self.client = client
        # The encoded weights file, rewritten in place by the next version of the same
        # size (no fresh buffer per publish).
        self._buffer: bytearray | None = None

    async def send(self, payload: VersionPayload) -> WeightManifest:
        manifest = await asyncio.to_thread(self.write, payload)
        await self.client.publish(manifest)
        return manifest

    async def send_staged(self, staged: StagedVersion) -> WeightManifest:
        """Make a version `stage` wrote visible and register it (retried: idempotent)."""
        manifest = await asyncio.to_thread(staged.commit)
        await self.client.publish(manifest)
        return manifest

    def write(self, payload: VersionPayload) -> WeightManifest:
        """Write the version's folder (blocking); a leftover of a failed attempt, never
        registered, is replaced."""
        return self.stage(payload).commit()

    def stage(self, payload: VersionPayload) -> StagedVersion:
        """Write the version's folder under a hidden temp name (blocking), not yet visible:
        `send_staged` commits and registers it. A leftover `v<N>` of a failed attempt,
        never registered, is replaced."""
        folder = version_dir(self.root, payload.version)
        if folder.exists():
            remove_inside(folder, self.root)
        files = encode_files(
            state_dict=payload.state_dict,
            config=payload.hf_config,
            reuse=self._buffer,
            extra_files=payload.files,
        )
        staged = stage_files(
            self.root,
            version=payload.version,
            step=payload.step,
            files=files,
            format=payload.format,
            base_version=payload.base_version,
        )
        weights = files[WEIGHTS_FILE]
        self._buffer = weights if isinstance(weights, bytearray) else None
        return staged


class FilesystemReceiver(WeightReceiver):
    source = "filesystem"

    async def fetch(
        self, manifest: WeightManifest, *, reuse: bool = False
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        return await asyncio.to_thread(load_version, manifest)
