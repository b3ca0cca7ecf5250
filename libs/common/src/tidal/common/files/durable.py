"""Durable, atomic writes: a crash never leaves a half-written file that looks complete.

The POSIX recipe in one place: write under a temporary name in the same folder, fsync,
rename over the final name, fsync the folder. Checkpoints, weight versions and progress
files all go through here. A write that finds no space raises `DiskFull` (path, bytes
needed) and its temporary file or folder is deleted (`removed_on_failure`), so a full
disk leaks nothing. `write_hashed` hashes a file on a second thread while it is written
and fsynced (both release the GIL), and starts each slice's writeback as it goes: a
checkpoint and a version are written between a trained step and the next generation.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tidal.common.errors import DiskFull

IO_SLICE = 16 << 20
"""Bytes per write(2) call: large enough to be cheap, small enough to stream."""
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing a just-written range to disk without waiting for it (Linux's
    `sync_file_range`), so the fsync after the last write has little left to do; the pages
    stay cached. Advisory: a no-op where unsupported, and its errors are the fsync's."""
    if _SYNC_FILE_RANGE is not None and length > 0:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


@contextlib.contextmanager
def space_for(path: Path, needed_bytes: int | None) -> Iterator[None]:
    """Raise `DiskFull(path, needed_bytes)` for an ENOSPC/EDQUOT inside the block."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFull(path, needed_bytes) from exc
        raise


def as_disk_full(exc: Exception, where: Path) -> Exception:
    """`exc` as a `DiskFull` when an ENOSPC/EDQUOT anywhere in its chain caused it (the
    path its OSError names, else `where`); otherwise `exc` itself."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DiskFull):
            return seen
        if isinstance(seen, OSError) and seen.errno in DISK_FULL_ERRNOS:
            return DiskFull(Path(seen.filename) if seen.filename else where, None)
        seen = seen.__cause__ or seen.__context__
    return exc


@contextlib.contextmanager
def removed_on_failure(tmp: Path) -> Iterator[Path]:
    """Yield `tmp` (a temporary file or folder); delete it if the block raises."""
    try:
        yield tmp
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.is_symlink() or tmp.is_file():  # never a device or other special file
            tmp.unlink(missing_ok=True)
        raise


def fsync_path(path: Path) -> None:
    """fsync one file or folder (a folder's fsync makes its entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file below `folder`, then the folder itself."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            fsync_path(path)
    fsync_path(folder)


def write_hashed(path: Path, chunks: Sequence[bytes | bytearray | memoryview]) -> str:
    """Write `chunks` in order to the file at `path` (replaced if there), fsync it, and
    return the sha256 of its bytes; the hash runs on its own thread beside the writes."""
    digest = hashlib.sha256()
    failure: list[BaseException] = []

    def hash_all() -> None:
        try:
            for chunk in chunks:
                digest.update(chunk)
        except BaseException as exc:  # re-raised on the caller's thread
            failure.append(exc)

    needed = sum(memoryview(chunk).nbytes for chunk in chunks)
    hasher = threading.Thread(target=hash_all, name="sha256", daemon=True)
    hasher.start()
    try:
        # (removed before `DiskFull` is made, so its free figure counts this file's space)
        with (
            space_for(path, needed),
            removed_on_failure(path),
            path.open("wb", buffering=0) as handle,
        ):
            offset = 0
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                done = 0
                while done < len(view):  # a raw write(2) may take fewer bytes
                    wrote = handle.write(view[done : done + IO_SLICE]) or 0
                    start_writeback(handle.fileno(), offset + done, wrote)
                    done += wrote
                offset += done
            os.fsync(handle.fileno())
    finally:
        hasher.join()
    if failure:
        raise failure[0]
    return digest.hexdigest()


def commit_dir(tmp: Path, final: Path) -> None:
    """Make a fully written (and fsynced) temporary folder visible as `final`, durably.

    `final` must not exist: the caller decides what an existing one means (rename(2)
    would silently replace an empty folder, so it is checked here)."""
    if final.exists():
        raise FileExistsError(f"{final} already exists; refusing to replace it")
    fsync_path(tmp)
    os.rename(tmp, final)
    fsync_path(final.parent)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers see the old or the new file, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    data = text.encode()
    with space_for(path, len(data)), removed_on_failure(tmp), tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
