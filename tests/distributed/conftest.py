"""Run a worker script as gloo ranks (`tests/helpers/gloo_ranks.py`), one thread per process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.gloo_ranks import run_ranks

WORKERS = Path(__file__).resolve().parent / "workers"


def run_worker(script: str, *args: str, nproc: int = 2, timeout: float = 240) -> None:
    """`nproc` = 1 runs the script as a plain process (the single-process reference)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [str(WORKERS / script), *args]
    if nproc == 1:
        done = subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env
        )
        returncode, output = done.returncode, done.stdout[-3000:] + done.stderr[-5000:]
    else:
        ranks = run_ranks(argv, nproc, timeout=timeout, env=env)
        returncode, output = ranks.returncode, ranks.output[-8000:]
    assert returncode == 0, f"{script} {args} failed:\n{output}"


@pytest.fixture(scope="session")
def worker() -> Callable[..., None]:
    return run_worker
