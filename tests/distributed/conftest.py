"""Run a worker script as gloo ranks (`tests/helpers/gloo_ranks.py`), one thread per process."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.gloo_ranks import run_ranks, run_script

WORKERS = Path(__file__).resolve().parent / "workers"


def run_worker(script: str, *args: str, nproc: int = 2, timeout: float = 240) -> None:
    """`nproc` = 1 runs the script as a plain process (the single-process reference)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [str(WORKERS / script), *args]
    if nproc == 1:
        done = run_script(argv, timeout=timeout, env=env)
    else:
        done = run_ranks(argv, nproc, timeout=timeout, env=env)
    assert done.returncode == 0, f"{script} {args} failed:\n{done.output[-8000:]}"


@pytest.fixture(scope="session")
def worker() -> Callable[..., None]:
    return run_worker
