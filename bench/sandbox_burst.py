"""Sandbox burst: how the service's own answers fare while many sandboxed programs start and run.

One process holds a gRPC health server and a `Sandbox` (as the orchestrator does), starts
`--executions` programs at once that each spin the CPU for `--spin-s`, and meanwhile
asks its own health service every 20 ms. Per repeat:
- health: p50 / p99 / max of the Check round trips;
- loop lag: p99 / max of how late a 5 ms sleep on the loop wakes (the loop's stalls);
- starts on the loop: how many `subprocess.Popen` calls ran on the loop's thread and the
  seconds they held it (the executor starts processes on starter threads: expect 0);
- runqueue wait: seconds the loop's thread was ready but not running (the CPU scheduler,
  not the loop, is what is left).
`--hog` adds one CPU-bound process beside it, in the same session (as a busy neighbour).

    python bench/sandbox_burst.py [--executions 64] [--spin-s 1.5] [--repeats 3] [--hog]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import grpc
from common import print_table, write_result
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.server import GrpcServer
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.orchestrator.scoring.sandbox import Sandbox, SandboxLimits

POPEN_ON_LOOP: list[float] = []
_popen_init = subprocess.Popen.__init__


def _timed_popen(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    started = time.monotonic()
    try:
        _popen_init(self, *args, **kwargs)
    finally:
        if threading.current_thread() is threading.main_thread():
            POPEN_ON_LOOP.append(time.monotonic() - started)


subprocess.Popen.__init__ = _timed_popen  # type: ignore[method-assign]


def _runqueue_wait_s() -> float:
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stats:
        return int(stats.read().split()[1]) / 1e9


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


async def one_burst(executions: int, spin_s: float) -> dict[str, Any]:
    server = GrpcServer("127.0.0.1:0", [], GrpcConfig(), security=PLAINTEXT_LOOPBACK)
    await server.start()
    sandbox = Sandbox(SandboxLimits(max_concurrency=executions, wall_s=60))
    program = (
        f"import time\nend = time.monotonic() + {spin_s}\nwhile time.monotonic() < end:\n    pass"
    )
    health, lags = [], []
    done = False

    async def watch_loop() -> None:
        while not done:
            asked = time.monotonic()
            await asyncio.sleep(0.005)
            lags.append(time.monotonic() - asked - 0.005)

    watcher = asyncio.ensure_future(watch_loop())
    POPEN_ON_LOOP.clear()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest())  # connect first
            waited, started = _runqueue_wait_s(), time.monotonic()
            runs = asyncio.gather(*(sandbox.run(program) for _ in range(executions)))
            while not runs.done():
                asked = time.monotonic()
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
                health.append(time.monotonic() - asked)
                await asyncio.sleep(0.02)
            results = await runs
            seconds, waited = time.monotonic() - started, _runqueue_wait_s() - waited
    finally:
        done = True
        await watcher
        await server.stop()
    ms = 1000.0
    return {
        "ok": sum(r.ok for r in results),
        "seconds": round(seconds, 2),
        "checks": len(health),
        "health_p50_ms": round(_quantile(health, 0.5) * ms, 1),
        "health_p99_ms": round(_quantile(health, 0.99) * ms, 1),
        "health_max_ms": round(max(health) * ms, 1),
        "lag_p99_ms": round(_quantile(lags, 0.99) * ms, 1),
        "lag_max_ms": round(max(lags) * ms, 1),
        "starts_on_loop": len(POPEN_ON_LOOP),
        "start_s_on_loop": round(sum(POPEN_ON_LOOP), 3),
        "runqueue_wait_s": round(waited, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--executions", type=int, default=64)
    parser.add_argument("--spin-s", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hog", action="store_true")
    args = parser.parse_args()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.hog else None
    try:
        rows = [asyncio.run(one_burst(args.executions, args.spin_s)) for _ in range(args.repeats)]
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    print_table("sandbox burst", rows)
    summary = {
        key: statistics.median(row[key] for row in rows)
        for key in ("health_p99_ms", "lag_max_ms", "start_s_on_loop", "runqueue_wait_s")
    }
    path = write_result("sandbox_burst", config=vars(args), results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
