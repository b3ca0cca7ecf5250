"""A small disk for full-disk tests: a tmpfs of a given size (root mounts it, as in CI;
the test is skipped elsewhere), and a filler that takes all but a little of its space."""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """`folder` as a fresh tmpfs of `size` (e.g. "64m") while the block runs."""
    folder.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave: int) -> Path:
    """A file taking all of `folder`'s filesystem but `leave` bytes; returns its path.

    The run under test writes to the same filesystem meanwhile, so the disk can fill
    before the filler is done: it then gives back what the run took, down to `leave`."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as f:  # unbuffered: nothing left to flush on ENOSPC
        left = shutil.disk_usage(folder).free - leave
        try:
            while left > 0:
                left -= f.write(b"\0" * min(left, 1 << 20))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        short = leave - shutil.disk_usage(folder).free
        if short > 0:
            f.truncate(max(0, f.tell() - short))
    return filler
