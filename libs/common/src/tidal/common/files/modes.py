"""Who may read what a run writes: its file policy, applied once per process as a umask.

A run folder holds weights, checkpoints with optimizer state, prompts, traces and logs, so
only the run's user reads it: every process of a run sets umask 0o077 before it creates
anything, and whatever code then makes a folder or file (ours, torch, safetensors,
logging) makes it 0700 / 0600. `run.shared_readable` sets 0o022 (0755 / 0644) instead. A
umask, not chmod calls after the fact, because it covers every writer and inherits into
child processes; the roles of one run run as one user, so it hides nothing one role reads
from another (docs/operations.md, "File modes").
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_UMASK = 0o077
"""Folders 0700, files 0600: the run's user only."""
SHARED_UMASK = 0o022
"""Folders 0755, files 0644: readable (not writable) by the group and other users."""


def apply_file_policy(*, shared_readable: bool) -> int:
    """Set this process's umask from the run's file policy (children inherit it); returns
    the umask it replaced."""
    return os.umask(SHARED_UMASK if shared_readable else PRIVATE_UMASK)


def make_private_dirs(folder: Path) -> None:
    """Create `folder` and each missing parent 0700 (or less, under a stricter umask).
    An existing folder keeps its mode: a shared 1777 parent stays shared."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            path.mkdir(mode=0o700)
