"""Run untrusted code in a confined child process: limits, a fresh work dir, a kill at the deadline.

Each execution is a new process in its own session (so `killpg` reaches everything it
started), with its own temporary working directory and, when the service runs as root, its
own uid: service files (TLS keys, the run folder) become unreadable, and the process limit
counts only that execution. The deadline, the output cap and the concurrency bound are
enforced here, in the caller's process, which never runs the code itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidal.orchestrator.scoring.sandbox.limits import MAX_CONCURRENCY, SandboxLimits

CHILD = str(Path(__file__).with_name("child.py"))
UID_BASE = 1_000_000
PID_SPAN = 1 << 22  # the kernel's largest pid_max
PROGRAM_FILE = "main.py"
FALLBACK_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None
    """The program's exit status; negative for a signal; None when it was killed here."""
    timed_out: bool
    killed_reason: str | None
    """"wall" (deadline), "output" (over output_bytes), "cpu" (RLIMIT_CPU) or None."""
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None


def _runnable_by_anyone(path: str) -> bool:
    real = Path(os.path.realpath(path))
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)


def python_for_programs(configured: str | None) -> str:
    """The interpreter of source programs: as configured, else one the sandbox uid can run."""
    if configured:
        return configured
    if os.geteuid() != 0 or _runnable_by_anyone(sys.executable):
        return sys.executable
    return next((p for p in FALLBACK_PYTHONS if _runnable_by_anyone(p)), sys.executable)


def sandbox_uid(slot: int) -> int | None:
    """The uid of an execution slot: unique among live processes and slots; None unless root."""
    if os.geteuid() != 0:
        return None
    return UID_BASE + (os.getpid() % PID_SPAN) * MAX_CONCURRENCY + slot


async def _read_capped(stream: asyncio.StreamReader, cap: int, over: asyncio.Event) -> bytes:
    """Keep the first `cap` bytes and read the rest to end of file, discarding it: a stream
    nobody reads pauses its pipe, and asyncio's `wait()` waits for every pipe's end."""
    kept = bytearray()
    while chunk := await stream.read(1 << 16):
        if len(kept) < cap:
            kept += chunk[: cap - len(kept)]
            if len(kept) >= cap:
                over.set()
    return bytes(kept)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class Sandbox:
    """An executor with its limits and a bound on concurrent executions."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.python = python_for_programs(self.limits.python)
        self._slots: asyncio.Queue[int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _slot_queue(self) -> asyncio.Queue[int]:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:  # a queue is bound to its loop
            self._loop, self._slots = loop, asyncio.Queue()
            for slot in range(self.limits.max_concurrency):
                self._slots.put_nowait(slot)
        return self._slots

    async def run(
        self,
        program: str | Sequence[str],
        *,
        stdin: bytes | str = b"",
        files: Mapping[str, str] | None = None,
    ) -> SandboxResult:
        """Run Python source (`str`) or an argv (its first item an absolute path) confined.

        `files` are written into the work dir first (names relative to it)."""
        slots = self._slot_queue()
        slot = await slots.get()
        workdir = Path(tempfile.mkdtemp(prefix="tidal-sandbox-"))
        try:
            uid = sandbox_uid(slot)
            argv = self._prepare(workdir, program, files or {}, uid)
            data = stdin.encode() if isinstance(stdin, str) else stdin
            return await self._execute(argv, workdir, uid, data)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            slots.put_nowait(slot)

    def _prepare(
        self, workdir: Path, program: str | Sequence[str], files: Mapping[str, str], uid: int | None
    ) -> list[str]:
        if isinstance(program, str):
            files = {**files, PROGRAM_FILE: program}
            argv = [self.python, "-I", "-S", "-B", PROGRAM_FILE]
        else:
            argv = list(program)
        for name, text in files.items():
            path = workdir / name
            if workdir not in path.resolve().parents:
                raise ValueError(f"sandbox file {name!r} is outside the work dir")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if uid is not None:
            for path in [workdir, *workdir.rglob("*")]:
                os.chown(path, uid, uid)
        return argv

    def _spec(self, workdir: Path, uid: int | None) -> str:
        lim = self.limits
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8"}
        return json.dumps(
            {
                "cpu_s": lim.cpu_s,
                "memory_bytes": lim.memory_mb << 20,
                "file_size_bytes": lim.file_size_mb << 20,
                "processes": lim.processes,
                "open_files": lim.open_files,
                "network": lim.network,
                "uid": uid,
                "parent_pid": os.getpid(),
                "env": env | {"TMPDIR": str(workdir)},
            }
        )

    async def _execute(
        self, argv: list[str], workdir: Path, uid: int | None, stdin: bytes
    ) -> SandboxResult:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-B", CHILD, self._spec(workdir, uid), *argv,
            cwd=workdir,
            env={},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        try:
            killed, stdout, stderr = await self._supervise(proc, stdin)
        finally:
            _kill_group(proc.pid)  # also on cancellation: nothing outlives its call
        code = proc.returncode
        if killed is None and code == -signal.SIGXCPU:  # RLIMIT_CPU
            killed = "cpu"
        return SandboxResult(
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
            exit_code=None if killed in ("wall", "output") else code,
            timed_out=killed == "wall",
            killed_reason=killed,
            seconds=time.monotonic() - started,
        )

    async def _supervise(
        self, proc: asyncio.subprocess.Process, stdin: bytes
    ) -> tuple[str | None, bytes, bytes]:
        """Feed stdin, keep capped output, and kill the group at the deadline or overflow."""
        assert proc.stdin and proc.stdout and proc.stderr
        over = asyncio.Event()
        cap = self.limits.output_bytes
        out = asyncio.ensure_future(_read_capped(proc.stdout, cap, over))
        err = asyncio.ensure_future(_read_capped(proc.stderr, cap, over))
        feed = asyncio.ensure_future(_feed(proc.stdin, stdin))
        exited = asyncio.ensure_future(proc.wait())
        overflow = asyncio.ensure_future(over.wait())
        try:
            await asyncio.wait(
                {exited, overflow}, timeout=self.limits.wall_s, return_when="FIRST_COMPLETED"
            )
            killed = None if exited.done() else ("output" if over.is_set() else "wall")
            _kill_group(proc.pid)  # whatever the program left running goes with it
            # a process that escaped the group may still hold the pipes: stop waiting soon
            await asyncio.wait({exited, out, err}, timeout=1.0)
            stdout = out.result() if out.done() else b""
            stderr = err.result() if err.done() else b""
        finally:
            for task in (out, err, feed, exited, overflow):
                task.cancel()
        return killed, stdout, stderr


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        if data:
            writer.write(data)
            await writer.drain()
        writer.close()
