"""Start a script as N ranks of one job on this machine, as torchrun would, without its agent.

The test process hosts the job's rendezvous store (a `TCPStore` on a port the kernel
picks, so parallel jobs cannot collide) and starts the ranks with the environment
torchrun gives them. torchrun's own agent (restarts, health checks, a rendezvous of its
own) is what the tests do not need, and its start-up costs a couple of seconds per job;
the product's launcher (`python -m tidal.trainer` with `world_size` > 1) keeps torchrun and
is tested through it.

Ranks are forked from a multiprocessing fork server that imported torch once per test
process: a fresh interpreter would spend seconds of CPU importing torch for each rank,
which on two cores is the largest part of the distributed tests' cost. A rank then runs
its script as `python script.py` would (`__main__`, its own `sys.argv`, the script's folder
first on `sys.path`, exactly the environment given), with the thread count of its
`OMP_NUM_THREADS` set through torch, since the OpenMP runtime read the variable when the
server imported torch. It ends as multiprocessing ends a process (streams flushed,
threads joined, then `os._exit`), so a script's `atexit` handlers do not run.

When a rank fails the others are killed (a survivor would wait at its next collective
until gloo's timeout), and the job's output comes back rank by rank.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
import torch.distributed as dist

_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(["torch", "torch.distributed"])


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
    envs = [{**base, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(nproc)]
    return run_processes(argv, envs, timeout=timeout)


def run_script(
    argv: Sequence[str], *, timeout: float = 240, env: Mapping[str, str] | None = None
) -> RanksResult:
    """Run `python argv...` as one plain process (no rank environment), as `run_ranks` runs
    each rank."""
    return run_processes(argv, [dict(os.environ if env is None else env)], timeout=timeout)


def run_processes(
    argv: Sequence[str], envs: Sequence[Mapping[str, str]], *, timeout: float
) -> RanksResult:
    """`python argv...` once per environment in `envs`, all at once."""
    with tempfile.TemporaryDirectory(prefix="tidal-ranks-") as folder:
        logs = [Path(folder) / f"rank{rank}.log" for rank in range(len(envs))]
        processes = []
        for env, log in zip(envs, logs, strict=True):
            process = _FORKS.Process(target=_become_script, args=(list(argv), dict(env), str(log)))
            process.start()
            processes.append(process)
        try:
            returncode = _wait_all(processes, timeout=timeout, argv=argv)
        finally:
            for process in processes:
                if process.exitcode is None:
                    process.kill()
                process.join()
                process.close()
        output = "".join(
            f"--- rank {rank} ---\n{log.read_text(errors='replace')}"
            for rank, log in enumerate(logs)
        )
    return RanksResult(returncode, output)


def _become_script(argv: list[str], env: dict[str, str], log: str) -> None:
    """In the forked process: become `python argv...` with `env`, output to `log`."""
    with open(log, "wb") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    os.environ.clear()
    os.environ.update(env)
    if env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(argv[0]).resolve().parent))
    runpy.run_path(argv[0], run_name="__main__")


def _wait_all(processes: Sequence[BaseProcess], *, timeout: float, argv: Sequence[str]) -> int:
    """0 once all exited 0; the first non-zero code as soon as one rank fails."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [process.exitcode for process in processes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            return failed[0]
        if all(code == 0 for code in codes):
            return 0
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(list(argv), timeout)
        time.sleep(0.05)
