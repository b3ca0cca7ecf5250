"""Find live processes by their command line, for tests that must see what a run started
(and that nothing of it outlived the run)."""

from __future__ import annotations

from pathlib import Path


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
