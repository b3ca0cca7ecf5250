"""Durable, atomic writes: what every service needs so that a crash never leaves a
half-written file or folder that looks complete.

The recipe is the POSIX one, in one place: write under a temporary name in the same
folder, fsync the data, rename over the final name (atomic within one filesystem), then
fsync the parent folder so the rename itself survives a power cut. Checkpoints (trainer),
weight versions (weightsync) and progress files (orchestrator) all go through here.
"""

from __future__ import annotations

import os
from pathlib import Path


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
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
