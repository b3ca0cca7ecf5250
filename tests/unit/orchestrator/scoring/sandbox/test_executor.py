"""The sandbox executor: confinement, limits, the deadline and the concurrency bound."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.server import GrpcServer
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.orchestrator.scoring.sandbox import Sandbox, SandboxLimits
from tidal.orchestrator.scoring.sandbox.uids import UID_BASE, UIDS_PER_PROCESS


async def test_a_program_runs_in_a_fresh_work_dir_with_a_minimal_environment() -> None:
    sandbox = Sandbox()
    program = (
        "import os, sys\nprint(os.getcwd())\nprint(sorted(os.environ))\nprint(sys.stdin.read())"
    )
    result = await sandbox.run(program, stdin="hello", files={"data/in.txt": "x"})
    cwd, env, stdin = result.stdout.splitlines()
    assert result.ok and (result.exit_code, result.killed_reason) == (0, None)
    assert stdin == "hello"
    assert env == str(sorted(["HOME", "LANG", "PATH", "TMPDIR"]))
    assert Path(cwd).parent.name.startswith("tidal-sandbox-") and not Path(cwd).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root")
async def test_each_concurrent_execution_runs_as_its_own_unprivileged_uid() -> None:
    sandbox = Sandbox(SandboxLimits(max_concurrency=4))
    program = "import os, time\ntime.sleep(0.3)\nprint(os.getuid())"
    results = await asyncio.gather(*(sandbox.run(program) for _ in range(4)))
    uids = {int(r.stdout) for r in results}
    assert len(uids) == 4 and 0 not in uids


async def test_the_deadline_kills_the_whole_process_group() -> None:
    sandbox = Sandbox(SandboxLimits(wall_s=0.5))
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)"
    result = await sandbox.run(program)
    assert result.timed_out and result.killed_reason == "wall" and result.exit_code is None
    assert 0.5 <= result.seconds < 2.0


async def test_output_past_the_cap_is_cut_and_kills_the_program() -> None:
    sandbox = Sandbox(SandboxLimits(output_bytes=1000))
    result = await sandbox.run("while True:\n    print('x' * 100)")
    assert result.killed_reason == "output" and len(result.stdout) == 1000


async def test_cpu_seconds_are_limited() -> None:
    sandbox = Sandbox(SandboxLimits(cpu_s=1, wall_s=20))
    result = await sandbox.run("while True:\n    pass")
    assert result.killed_reason == "cpu" and not result.timed_out


async def test_memory_is_limited() -> None:
    sandbox = Sandbox(SandboxLimits(memory_mb=256))
    result = await sandbox.run("x = bytearray(1 << 30)")
    assert result.exit_code == 1 and "MemoryError" in result.stderr


async def test_the_network_is_unreachable() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)"
        result = await Sandbox(SandboxLimits(network="isolate")).run(program)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's loopback
    finally:
        listener.close()
    # its own loopback (bubblewrap brings it up) or none at all (the fallback's namespace)
    assert result.exit_code == 1
    assert "Connection refused" in result.stderr or "Network is unreachable" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="finds the program by its sandbox uid")
async def test_a_cancelled_run_leaves_nothing_running() -> None:
    sandbox = Sandbox(SandboxLimits(max_concurrency=1))
    run = asyncio.ensure_future(sandbox.run("import os, time\nos.fork()\ntime.sleep(60)"))
    await asyncio.sleep(1.0)
    assert _live_sandbox_processes()  # it is running
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    deadline = time.monotonic() + 3.0
    while _live_sandbox_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _live_sandbox_processes() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="finds the program by its sandbox uid")
async def test_runs_cancelled_while_they_start_leave_nothing_behind() -> None:
    sandbox = Sandbox(SandboxLimits(max_concurrency=8))
    runs = [asyncio.ensure_future(sandbox.run("import time\ntime.sleep(60)")) for _ in range(8)]
    for run in runs:  # each at another point of its start: work dir, fork, pipes
        await asyncio.sleep(0.01)
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)
    deadline = time.monotonic() + 5.0
    while (_live_sandbox_processes() or _our_work_dirs()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _live_sandbox_processes() == [] and _our_work_dirs() == []


def _our_work_dirs() -> list[Path]:
    """Work dirs of this process's executions (by their uid: other processes' have others)."""
    ours = range(
        UID_BASE + os.getpid() * UIDS_PER_PROCESS, UID_BASE + (os.getpid() + 1) * UIDS_PER_PROCESS
    )
    found = []
    for root in Path(tempfile.gettempdir()).glob("tidal-sandbox-*"):
        with contextlib.suppress(OSError):
            if (root / "work").stat().st_uid in ours:
                found.append(root)
    return found


def _live_sandbox_processes() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and proc.stat().st_uid >= UID_BASE
                and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                found.append(proc.name)
        except OSError:
            pass
    return found


async def test_concurrency_is_bounded() -> None:
    sandbox = Sandbox(SandboxLimits(max_concurrency=2))
    started = time.monotonic()
    await asyncio.gather(*(sandbox.run("import time\ntime.sleep(0.5)") for _ in range(4)))
    assert time.monotonic() - started >= 1.0


async def test_health_answers_while_64_executions_run() -> None:
    server = GrpcServer("127.0.0.1:0", [], GrpcConfig(), security=PLAINTEXT_LOOPBACK)
    await server.start()
    sandbox = Sandbox(SandboxLimits(max_concurrency=64, wall_s=20))
    program = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end:\n    pass"
    latencies: list[float] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            await health.Check(health_pb2.HealthCheckRequest())  # connect first
            runs = asyncio.gather(*(sandbox.run(program) for _ in range(64)))
            while not runs.done():
                sent = time.monotonic()
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                latencies.append(time.monotonic() - sent)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                await asyncio.sleep(0.02)
            results = await runs
    finally:
        await server.stop()
    assert all(r.ok for r in results)
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    # The target is 100 ms (met alone); the full suite on two shared cores measured 104 ms once.
    assert len(latencies) >= 20 and p99 < 0.15, f"p99 {p99 * 1000:.0f} ms over {len(latencies)}"
