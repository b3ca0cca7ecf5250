"""Find live processes by their command line, for tests that must see what a run started
(and that nothing of it outlived the run), and give the processes a test starts a
temporary folder of the test's own."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def stack_scratch() -> Iterator[Path]:
    """A folder for the `TMPDIR` of the services a test starts, removed at exit: a service
    the test kills leaves its temporary folders (the gateway's socket folder, sandbox work
    dirs) here, not in /tmp. Short, for the socket's path limit; sandbox uids pass through
    it to their work dirs."""
    with tempfile.TemporaryDirectory(prefix="tidal-it-", ignore_cleanup_errors=True) as folder:
        scratch = Path(folder)
        scratch.chmod(0o711)
        yield scratch


def processes_with(needle: bytes) -> list[int]:
    """Pids of live processes whose command line contains `needle` (zombies have an empty
    command line and do not count)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids
