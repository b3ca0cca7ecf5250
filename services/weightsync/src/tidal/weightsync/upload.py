"""Receiving an uploaded version (the "stream" path) into the root: atomic, verified, resumable.

Files go into a temp folder, hashed while written, and become `v<version>` only once sizes
and sha256 match. A cut stream keeps its session (open files, running hashes), so a stream
with the same manifest resumes without re-reading anything; a wrong stream discards its
session at once; a write that finds the disk full raises `DiskFull`. Finishing is
shielded from cancellation, and each write overlaps the next chunk's arrival. A retired
version's weights file is kept as a spare that the next upload writes over in place: its
pages are cached, where a new file's are allocated afresh. The rules are in
docs/weightsync.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from tidal.common.errors import InvalidArgument, Unavailable
from tidal.common.files.durable import commit_dir, fsync_path, space_for, start_writeback
from tidal.common.files.safe_remove import remove_inside
from tidal.weights.folder import TMP_PREFIX, sweep_partial, version_dir
from tidal.weights.manifest import MANIFEST_FILE, WEIGHTS_FILE, CorruptWeights, WeightManifest

SPARE_DIR = ".spare"
"""Under the root: the weights file of the newest retired version, for the next upload."""


@dataclass(frozen=True)
class UploadChunk:
    path: str
    offset: int
    data: bytes | memoryview


@dataclass
class _OpenFile:
    handle: BinaryIO
    digest: hashlib._Hash
    written: int = 0

    def append(self, data: bytes | memoryview) -> None:
        with space_for(Path(self.handle.name), len(data)):
            self._append(data)

    def _append(self, data: bytes | memoryview) -> None:
        self.handle.write(data)
        self.handle.flush()
        start_writeback(self.handle.fileno(), self.written, len(data))  # overlaps the upload
        self.digest.update(data)
        self.written += len(data)


def _key(manifest: WeightManifest) -> WeightManifest:
    return replace(manifest, location="")


class UploadSession:
    """The files of one upload in a temp folder, with their running sha256."""

    def __init__(self, root: Path, manifest: WeightManifest) -> None:
        self.manifest = manifest
        self.key = _key(manifest)
        self.root = root
        self.folder = root / f"{TMP_PREFIX}v{manifest.version:06d}-{uuid.uuid4().hex[:8]}"
        self.folder.mkdir(parents=True)
        self.expected = {f.path: f for f in manifest.files}
        self.files: dict[str, _OpenFile] = {}
        self.owner = 0  # the stream that may write: each new stream takes over
        self.finishing = False
        self._writing = asyncio.Lock()
        self._appending: asyncio.Future[None] | None = None  # the previous chunk's write

    def progress(self) -> dict[str, int]:
        return {path: f.written for path, f in self.files.items()}

    async def settle(self) -> None:
        """Wait for the chunk still being written; raises its error."""
        pending, self._appending = self._appending, None
        if pending is not None:
            await pending

    async def write(self, chunk: UploadChunk, owner: int) -> None:
        """Check the chunk and start writing it (finished by the next `write` or `settle`)."""
        async with self._writing:
            await self.settle()
            if owner != self.owner:
                raise Unavailable("this upload stream was superseded by a newer one")
            if chunk.path not in self.expected:
                raise InvalidArgument("chunk.path", f"{chunk.path!r} is not in the manifest")
            f = self.files.get(chunk.path)
            if f is None:
                with space_for(self.folder / chunk.path, None):
                    handle = self._open(chunk.path)
                f = self.files[chunk.path] = _OpenFile(handle, hashlib.sha256())
            if chunk.offset > f.written or chunk.offset < 0:
                raise InvalidArgument(
                    "chunk.offset",
                    f"{chunk.path}: expected offset {f.written} or less, got {chunk.offset}",
                )
            size = self.expected[chunk.path].size
            if chunk.offset + len(chunk.data) > size:
                raise InvalidArgument(
                    "chunk.data",
                    f"{chunk.path}: bytes {chunk.offset}..{chunk.offset + len(chunk.data)} run "
                    f"past the file's size in the manifest, {size}",
                )
            skip = f.written - chunk.offset  # bytes of this chunk already received
            if skip < len(chunk.data):
                data = memoryview(chunk.data)[skip:]
                self._appending = asyncio.ensure_future(asyncio.to_thread(f.append, data))

    def _open(self, name: str) -> BinaryIO:
        """A new file of the upload: the spare, renamed into place, when there is one."""
        target = self.folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        spare = self.root / SPARE_DIR / name
        if name == WEIGHTS_FILE and spare.is_file():
            os.replace(spare, target)
            return target.open("r+b")  # written over in place, truncated in `finish`
        return target.open("wb")

    def finish(self, final: Path) -> WeightManifest:
        """Verify sizes and sha256, fsync, rename into place; CorruptWeights on mismatch,
        DiskFull when the files or the manifest do not fit."""
        with space_for(self.folder, None):
            return self._finish(final)

    def _finish(self, final: Path) -> WeightManifest:
        for name, want in self.expected.items():
            f = self.files.get(name)
            size, digest = (
                (f.written, f.digest.hexdigest()) if f else (0, hashlib.sha256().hexdigest())
            )
            if size != want.size or digest != want.sha256:
                raise CorruptWeights(
                    f"upload of version {self.manifest.version}: {name} arrived with {size} "
                    f"bytes and sha256 {digest[:12]}…, manifest says {want.size} bytes, "
                    f"{want.sha256[:12]}…"
                )
            if f is None:
                (self.folder / name).touch()
        for f in self.files.values():
            f.handle.truncate(f.written)  # a spare may have been longer
            f.handle.flush()
            os.fsync(f.handle.fileno())
            f.handle.close()
        published = replace(self.manifest, location=str(final))
        (self.folder / MANIFEST_FILE).write_text(published.to_json())
        fsync_path(self.folder / MANIFEST_FILE)
        commit_dir(self.folder, final)
        return published

    def discard(self) -> None:
        self.owner += 1  # a stream still attached to it fails UNAVAILABLE on its next chunk
        if self._appending is not None:  # its file closes under it: the error is moot
            self._appending.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._appending = None
        for f in self.files.values():
            f.handle.close()
        remove_inside(self.folder, self.root, ignore_errors=True)


class UploadReceiver:
    """Uploads into `root`, one pending (resumable) session at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._session: UploadSession | None = None

    def recycle(self, folder: Path) -> None:
        """Keep a retired version's weights file as the spare (replacing an older one)."""
        source = folder / WEIGHTS_FILE
        if source.is_file() and not source.is_symlink():
            (self.root / SPARE_DIR).mkdir(exist_ok=True)
            os.replace(source, self.root / SPARE_DIR / WEIGHTS_FILE)

    def progress(self, manifest: WeightManifest) -> dict[str, int]:
        """Bytes received per file by the pending upload of `manifest`; {} when none."""
        session = self._session
        if session is None or session.key != _key(manifest):
            return {}
        return session.progress()

    def _session_for(self, manifest: WeightManifest) -> UploadSession:
        session = self._session
        if session is not None and session.finishing:
            raise Unavailable(
                f"the upload of version {session.manifest.version} is being verified; retry shortly"
            )
        if session is not None and session.key == _key(manifest):
            return session
        if session is not None:
            session.discard()
        sweep_partial(self.root)
        self._session = UploadSession(self.root, manifest)
        return self._session

    async def receive(
        self,
        manifest: WeightManifest,
        chunks: AsyncIterator[UploadChunk],
        register: Callable[[WeightManifest], Awaitable[None]],
    ) -> WeightManifest:
        """Receive chunks into the session of `manifest`, then verify, rename and
        `register` it; returns the published manifest (location = final folder).

        Raises InvalidArgument for malformed chunks and CorruptWeights when a file's size
        or sha256 does not match; nothing becomes visible in either case. A stream that
        breaks off leaves the session for a resumed upload.
        """
        final = version_dir(self.root, manifest.version)
        if final.exists():
            raise InvalidArgument("manifest.version", f"version {manifest.version} already exists")
        self.root.mkdir(parents=True, exist_ok=True)
        session = self._session_for(manifest)
        session.owner += 1
        owner = session.owner
        try:
            async for chunk in chunks:
                await session.write(chunk, owner)
            await session.settle()
            if owner != session.owner:
                raise Unavailable("this upload stream was superseded by a newer one")
            session.finishing = True  # until _complete drops the session
            return await asyncio.shield(self._complete(session, final, register))
        except InvalidArgument:
            if owner == session.owner:
                self._drop(session)
            raise

    async def _complete(
        self,
        session: UploadSession,
        final: Path,
        register: Callable[[WeightManifest], Awaitable[None]],
    ) -> WeightManifest:
        try:
            published = await asyncio.to_thread(session.finish, final)
            await register(published)
            return published
        finally:
            self._drop(session)  # spent: registered, or refused and removed

    def _drop(self, session: UploadSession) -> None:
        session.discard()
        if self._session is session:
            self._session = None
