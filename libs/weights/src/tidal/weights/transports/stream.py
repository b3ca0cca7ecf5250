"""The stream transport: chunked gRPC through weightsync, for hosts without a shared folder.

The sender encodes the version's files in memory (`codec.encode_version`, hashed once)
into a buffer it keeps and rewrites for the next version of the same size, and uploads
them with `UploadWeights` (resumable); weightsync hashes them while writing. The receiver
fetches with `FetchWeights` (resumable, hashed as chunks land) into the previous fetch's
buffers and decodes views of them (`codec.decode_version`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tidal.weights.codec import decode_version, encode_version
from tidal.weights.manifest import WEIGHTS_FILE, WeightManifest
from tidal.weights.transports.base import VersionPayload, WeightReceiver, WeightSender

if TYPE_CHECKING:
    import torch

    from tidal.weights.client import WeightSyncClient


class StreamSender(WeightSender):
    def __init__(self, client: WeightSyncClient, *, chunk_bytes: int) -> None:
        self.client = client
        self.chunk_bytes = chunk_bytes
        self._buffer: bytearray | None = None  # the previous version's weights file

    async def send(self, payload: VersionPayload) -> WeightManifest:
        manifest, files = await asyncio.to_thread(
            lambda: encode_version(
                version=payload.version,
                step=payload.step,
                state_dict=payload.state_dict,
                config=payload.hf_config,
                format=payload.format,
                base_version=payload.base_version,
                reuse=self._buffer,
                extra_files=payload.files,
            )
        )
        await self.client.upload(manifest, files, chunk_bytes=self.chunk_bytes)
        weights = files[WEIGHTS_FILE]
        self._buffer = weights if isinstance(weights, bytearray) else None
        return manifest


class StreamReceiver(WeightReceiver):
    source = "stream"

    def __init__(self, client: WeightSyncClient) -> None:
        self.client = client
        self._fetched: dict[str, bytearray] = {}  # the previous `reuse` fetch's buffers

    async def fetch(
        self, manifest: WeightManifest, *, reuse: bool = False
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        if not reuse:  # e.g. a LoRA base the caller keeps: buffers of its own
            files = await self.client.fetch_files(manifest)
        else:
            files = await self.client.fetch_files(manifest, reuse=self._fetched)
            self._fetched = files
        return await asyncio.to_thread(decode_version, files)
