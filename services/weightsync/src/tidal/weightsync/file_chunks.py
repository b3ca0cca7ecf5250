"""Reading a version's file in chunks without blocking the event loop (`FetchWeights`).

Every open, seek and read runs in a worker thread, one chunk at a time, so the server keeps
answering other RPCs however slow the disk is, and memory stays at one chunk per stream (a
read-ahead thread would run ahead of what gRPC sends and hold more).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO


class FileChunks:
    """`async with FileChunks(path, offset, size) as f: async for data in f: ...`"""

    def __init__(self, path: Path, offset: int, chunk_bytes: int) -> None:
        self.path = path
        self.offset = offset
        self.chunk_bytes = chunk_bytes
        self._handle: BinaryIO | None = None

    async def __aenter__(self) -> FileChunks:
        self._handle = await asyncio.to_thread(self._open)
        return self

    def _open(self) -> BinaryIO:
        handle = self.path.open("rb")
        if self.offset:  # a pipe or socket standing in for the file cannot seek at all
            handle.seek(self.offset)
        return handle

    async def __aexit__(self, *exc_info: object) -> None:
        if self._handle is not None:
            self._handle.close()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert self._handle is not None, "use FileChunks in `async with`"
        while data := await asyncio.to_thread(self._handle.read, self.chunk_bytes):
            yield data
