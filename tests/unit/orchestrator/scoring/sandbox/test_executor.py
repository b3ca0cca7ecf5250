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
from tidal.orchestrator.scoring.sandbox.command import NICENESS
from tidal.orchestrator.scoring.sandbox.uids import UID_BASE, UIDS_PER_PROCESS
from tidal.orchestrator.scoring.sandbox.workdir import PROGRAM_FILE

from .....helpers.sandbox_walls import ROOMY_WALL_S

GONE_WITHIN_S = 30.0  # killed processes exit at the sandbox's priority: slowly on a busy host


async def test_a_program_runs_in_a_fresh_work_dir_with_a_minimal_environment() -> None:
    sandbox = Sandbox(SandboxLimits(wall_s=ROOMY_WALL_S))
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
    sandbox = Sandbox(SandboxLimits(max_concurrency=4, wall_s=ROOMY_WALL_S))
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
    sandbox = Sandbox(SandboxLimits(output_bytes=1000, wall_s=ROOMY_WALL_S))
    result = await sandbox.run("while True:\n    print('x' * 100)")
    assert result.killed_reason == "output" and len(result.stdout) == 1000


async def test_cpu_seconds_are_limited() -> None:
    sandbox = Sandbox(SandboxLimits(cpu_s=1, wall_s=ROOMY_WALL_S))
    result = await sandbox.run("while True:\n    pass")
    assert result.killed_reason == "cpu" and not result.timed_out  # the CPU limit ended it


async def test_memory_is_limited() -> None:
    sandbox = Sandbox(SandboxLimits(memory_mb=256, wall_s=ROOMY_WALL_S))
    result = await sandbox.run("x = bytearray(1 << 30)")
    assert result.exit_code == 1 and "MemoryError" in result.stderr


async def test_the_network_is_unreachable() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)"
        result = await Sandbox(SandboxLimits(network="isolate", wall_s=ROOMY_WALL_S)).run(program)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's loopback
    finally:
        listener.close()
    # its own loopback (bubblewrap brings it up) or none at all (the fallback's namespace)
    assert result.exit_code == 1
    assert "Connection refused" in result.stderr or "Network is unreachable" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="finds the program by its sandbox uid")
async def test_a_cancelled_run_leaves_nothing_running() -> None:
    deadline = time.monotonic() + GONE_WITHIN_S  # what earlier tests killed may still exit
    while _live_sandbox_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    sandbox = Sandbox(SandboxLimits(max_concurrency=1, wall_s=ROOMY_WALL_S))
    program = "import os, time\nos.fork()\ntime.sleep(600)"
    run = asyncio.ensure_future(sandbox.run(program))
    deadline = time.monotonic() + ROOMY_WALL_S / 2
    while len(_running(PROGRAM_FILE)) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(_running(PROGRAM_FILE)) == 2 and not run.done()  # it and its fork run
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    deadline = time.monotonic() + GONE_WITHIN_S
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
    deadline = time.monotonic() + GONE_WITHIN_S
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


def _running(script: str) -> list[str]:
    """Live sandbox processes running `script` (not bwrap or the child starting it)."""
    found = []
    for pid in _live_sandbox_processes():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            box = argv[0].endswith(b"bwrap") or any(a.endswith(b"/child.py") for a in argv)
            # the program, not what starts it (a process between fork and exec, or
            # exiting, has an empty command line)
            if argv[-2:-1] == [script.encode()] and not box:
                found.append(pid)
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


async def test_programs_yield_the_cpu_to_the_service_and_cannot_take_it_back() -> None:
    """Lower priority than the service, for the program's processes and, where the kernel
    groups sessions for the scheduler, for its session's autogroup too."""
    program = (
        "import os\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0))\n"
        "try:\n"
        "    os.setpriority(os.PRIO_PROCESS, 0, 0)\n"
        "except PermissionError:\n"
        "    print('refused')\n"
        "try:\n"
        "    print(open('/proc/self/autogroup').read().split()[-1])\n"
        "except FileNotFoundError:\n"
        "    print('absent')\n"  # a kernel without autogroup
    )
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    for isolation in ("auto", "process"):
        limits = SandboxLimits(isolation=isolation, wall_s=ROOMY_WALL_S)
        result = await Sandbox(limits).run(program)
        nice, renice, autogroup = result.stdout.split()
        assert result.ok and int(nice) == ours + NICENESS and renice == "refused", isolation
        if os.geteuid() == 0:  # not root, the kernel may refuse a renice 100 ms after another
            assert autogroup in ("absent", str(NICENESS)), isolation


async def test_concurrency_is_bounded() -> None:
    sandbox = Sandbox(SandboxLimits(max_concurrency=2))
    started = time.monotonic()
    await asyncio.gather(*(sandbox.run("import time\ntime.sleep(0.5)") for _ in range(4)))
    assert time.monotonic() - started >= 1.0


async def test_health_answers_while_64_executions_run() -> None:
    server = GrpcServer("127.0.0.1:0", [], GrpcConfig(), security=PLAINTEXT_LOOPBACK)
    await server.start()
    sandbox = Sandbox(SandboxLimits(max_concurrency=64, wall_s=ROOMY_WALL_S))
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
    print(f"health p99 {p99 * 1000:.0f} ms over {len(latencies)} checks")  # in -rP reports
    # The target is 100 ms (met alone); the full suite on two shared cores measured 104 ms once.
    assert len(latencies) >= 20 and p99 < 0.15, f"p99 {p99 * 1000:.0f} ms over {len(latencies)}"
