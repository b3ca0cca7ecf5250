"""Start a script as N ranks of one job on this machine, as torchrun would, without its agent.

The test process hosts the job's rendezvous store (a `TCPStore` on a port the kernel
picks, so parallel jobs cannot collide) and starts the ranks with the environment
torchrun gives them. torchrun's own agent (restarts, health checks, a rendezvous of its
own) is what the tests do not need, and its start-up costs a couple of seconds per job;
the product's launcher (`python -m tidal.trainer` with `world_size` > 1) keeps torchrun and
is tested through it.

When a rank fails the others are killed (a survivor would wait at its next collective
until gloo's timeout), and the job's output comes back rank by rank.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist


@dataclass(frozen=True)
class RanksResult:
    returncode: int
    """0 when every rank exited 0; else the first failing rank's code (-N for signal N)."""
    output: str
    """Every rank's stdout and stderr, rank by rank."""


def run_ranks(
    argv: Sequence[str],
    nproc: int = 2,
    *,
    timeout: float = 240,
    env: Mapping[str, str] | None = None,
) -> RanksResult:
    """Run `python argv...` as `nproc` ranks; `subprocess.TimeoutExpired` past `timeout`."""
    store = dist.TCPStore(  # this frame keeps it serving until the ranks are done
        "127.0.0.1",
        0,
        world_size=nproc,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    base = {
        **(os.environ if env is None else env),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # every rank is a client of our store
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
    }
    with tempfile.TemporaryDirectory(prefix="tidal-ranks-") as folder:
        logs = [Path(folder) / f"rank{rank}.log" for rank in range(nproc)]
        processes = []
        for rank, log in enumerate(logs):
            with log.open("wb") as sink:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, *argv],
                        env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                )
        try:
            returncode = _wait_all(processes, timeout=timeout, argv=argv)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
        output = "".join(
            f"--- rank {rank} ---\n{log.read_text(errors='replace')}"
            for rank, log in enumerate(logs)
        )
    return RanksResult(returncode, output)


def _wait_all(
    processes: list[subprocess.Popen[bytes]], *, timeout: float, argv: Sequence[str]
) -> int:
    """0 once all exited 0; the first non-zero code as soon as one rank fails."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [process.poll() for process in processes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            return failed[0]
        if all(code == 0 for code in codes):
            return 0
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(list(argv), timeout)
        time.sleep(0.05)
