"""Receiving an uploaded version (the "stream" path) into the root, atomically and verified.

Decisions:
- The same on-disk contract as the filesystem path: files go into a hidden temp folder,
  each is hashed *while* it is written (no second read), sizes and sha256 must match the
  manifest the uploader sent first, then the manifest is written, everything fsynced and
  the folder renamed to `v<version>`. An upload that breaks off or does not verify leaves
  only a temp folder, which is removed at once (and swept on the next publish anyway).
- Chunks of a file must arrive in order (offset == bytes received so far); anything else
  is INVALID_ARGUMENT naming the field, so a confused uploader cannot corrupt a file.
- File writes and hashing run in a worker thread per chunk, keeping the event loop free.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from tidal.common.errors import InvalidArgument
from tidal.weightsync.filesystem import TMP_PREFIX, fsync_path, sweep_partial, version_dir
from tidal.weightsync.manifest import MANIFEST_FILE, CorruptWeights, WeightManifest


@dataclass(frozen=True)
class UploadChunk:
    path: str
    offset: int
    data: bytes


@dataclass
class _OpenFile:
    handle: BinaryIO
    digest: hashlib._Hash
    written: int = 0


def _append(f: _OpenFile, data: bytes) -> None:
    f.handle.write(data)
    f.digest.update(data)
    f.written += len(data)


async def receive_upload(
    root: Path, manifest: WeightManifest, chunks: AsyncIterator[UploadChunk]
) -> WeightManifest:
    """Write an uploaded version under `root`; returns its manifest (location = final folder).

    Raises InvalidArgument for malformed chunks and CorruptWeights when a file's size or
    sha256 does not match; nothing becomes visible in either case.
    """
    final = version_dir(root, manifest.version)
    if final.exists():
        raise InvalidArgument("manifest.version", f"version {manifest.version} already exists")
    sweep_partial(root)
    tmp = root / f"{TMP_PREFIX}v{manifest.version:06d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    expected = {f.path: f for f in manifest.files}
    files: dict[str, _OpenFile] = {}
    try:
        async for chunk in chunks:
            if chunk.path not in expected:
                raise InvalidArgument("chunk.path", f"{chunk.path!r} is not in the manifest")
            f = files.get(chunk.path)
            if f is None:
                (tmp / chunk.path).parent.mkdir(parents=True, exist_ok=True)
                f = files[chunk.path] = _OpenFile((tmp / chunk.path).open("wb"), hashlib.sha256())
            if chunk.offset != f.written:
                raise InvalidArgument(
                    "chunk.offset",
                    f"{chunk.path}: expected offset {f.written}, got {chunk.offset}",
                )
            await asyncio.to_thread(_append, f, chunk.data)
        for name, want in expected.items():
            f = files.get(name)
            size, digest = (
                (f.written, f.digest.hexdigest()) if f else (0, hashlib.sha256().hexdigest())
            )
            if f is None:
                (tmp / name).touch()
            if size != want.size or digest != want.sha256:
                raise CorruptWeights(
                    f"upload of version {manifest.version}: {name} arrived with {size} bytes "
                    f"and sha256 {digest[:12]}…, manifest says {want.size} bytes, "
                    f"{want.sha256[:12]}…"
                )
        for f in files.values():
            f.handle.flush()
            os.fsync(f.handle.fileno())
            f.handle.close()
        published = replace(manifest, location=str(final))
        (tmp / MANIFEST_FILE).write_text(published.to_json())
        fsync_path(tmp / MANIFEST_FILE)
        fsync_path(tmp)
        os.rename(tmp, final)
        fsync_path(root)
        return published
    finally:
        for f in files.values():
            f.handle.close()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
