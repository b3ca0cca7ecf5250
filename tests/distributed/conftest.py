"""Run a worker script under `torchrun --standalone` (gloo, one thread per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent / "workers"


def run_worker(script: str, *args: str, nproc: int = 2, timeout: float = 240) -> None:
    """`nproc` = 1 runs the script as a plain process (the single-process reference)."""
    launcher = (
        [sys.executable]
        if nproc == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
        ]
    )
    done = subprocess.run(
        [*launcher, str(WORKERS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, (
        f"{script} {args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


@pytest.fixture(scope="session")
def worker() -> Callable[..., None]:
    return run_worker
