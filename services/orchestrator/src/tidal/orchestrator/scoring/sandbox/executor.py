"""Run untrusted code confined: limits, a fresh work dir, the deadline, nothing left behind.

Where bubblewrap is installed and usable (isolation.py, probed once per process), each
execution runs in its own namespaces (bubblewrap.py): it sees none of the run, has a
private /tmp and /dev/shm and no network, and every process it started dies when it ends.
Elsewhere the fallback is a confined child process (child.py) in its own session with
rlimits and, as root, its own uid; a warning at start names what that leaves open. In
both, as root the program runs as an unprivileged uid no other execution holds (uids.py)
in its own work dir (workdir.py), and the deadline, the output cap and the concurrency
bound are enforced here, in the caller's process, which never runs the code itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidal.orchestrator.scoring.sandbox.command import NICENESS, sandbox_command
from tidal.orchestrator.scoring.sandbox.isolation import choose_isolation, python_for_programs
from tidal.orchestrator.scoring.sandbox.limits import SandboxLimits
from tidal.orchestrator.scoring.sandbox.processes import (
    Converse,
    Process,
    feed,
    kill_group,
    kill_uid,
    off_loop,
    read_capped,
    start,
    talk,
)
from tidal.orchestrator.scoring.sandbox.uids import UIDS
from tidal.orchestrator.scoring.sandbox.workdir import clean_up, prepare_workdir, remove_workdir


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


class Sandbox:
    """An executor with its limits and a bound on concurrent executions."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.bwrap, self.python = choose_isolation(
            self.limits, python_for_programs(self.limits.python)
        )
        """bubblewrap's path when executions use it; None for the fallback child."""
        self._gate: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._gate is None or self._loop is not loop:  # a semaphore is bound to its loop
            self._loop, self._gate = loop, asyncio.Semaphore(self.limits.max_concurrency)
        return self._gate

    async def run(
        self,
        program: str | Sequence[str],
        *,
        stdin: bytes | str = b"",
        files: Mapping[str, str] | None = None,
        converse: Converse | None = None,
        read_only: Sequence[str] = (),
    ) -> SandboxResult:
        """Run Python source (`str`) or an argv (its first item an absolute path) confined.

        `files` are written into the work dir first (names relative to it). With
        `converse`, the caller talks to the program over its stdin and stdout instead of
        `stdin` and the result's `stdout` (which is then empty). `read_only` names host
        paths (absolute, existing) bubblewrap mounts read-only at the same paths; the
        fallback sees the host's files anyway, as far as its uid may."""
        async with self._slot():
            uid = UIDS.take()
            root = None
            try:
                root, workdir, argv = await off_loop(
                    prepare_workdir,
                    program,
                    files or {},
                    uid,
                    self.python,
                    abandon=remove_workdir,
                )
                data = stdin.encode() if isinstance(stdin, str) else stdin
                return await self._execute(argv, workdir, uid, data, converse, read_only)
            finally:
                await off_loop(clean_up, root, uid)

    async def _execute(
        self,
        argv: list[str],
        workdir: Path,
        uid: int | None,
        stdin: bytes,
        converse: Converse | None,
        read_only: Sequence[str],
    ) -> SandboxResult:
        started = time.monotonic()
        status = os.pipe() if self.bwrap else None  # pid 1's report of the program's exit
        try:
            proc = await start(
                sandbox_command(
                    self.limits,
                    bwrap=self.bwrap,
                    python=self.python,
                    argv=argv,
                    workdir=workdir,
                    uid=uid,
                    status_fd=status[1] if status else None,
                    read_only=read_only,
                ),
                cwd=workdir,
                pass_fds=status[1:] if status else (),
                limit=self.limits.output_bytes + 1,
                niceness=NICENESS,
            )
            reap = uid if self.bwrap is None else None  # the fallback, as root
            try:
                killed, stdout, stderr = await self._supervise(proc, stdin, converse, reap)
            except BaseException:
                kill_group(proc.pid)  # on cancellation too: nothing outlives its call
                if reap is not None:
                    await off_loop(kill_uid, reap)
                raise
            finally:
                proc.close()
            code = _status(status[0]) if status else proc.returncode
        finally:
            if status:
                os.close(status[0])
        if code is None:  # bubblewrap ended before its pid 1 reported
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
        self,
        proc: Process,
        stdin: bytes,
        converse: Converse | None,
        reap_uid: int | None,
    ) -> tuple[str | None, bytes, bytes]:
        """Feed stdin (or converse), keep capped output, kill the group at the deadline or
        overflow."""
        over = asyncio.Event()
        cap = self.limits.output_bytes
        if converse is None:
            out = asyncio.ensure_future(read_capped(proc.stdout, cap, over))
            writing = asyncio.ensure_future(feed(proc.stdin, stdin))
        else:
            out = asyncio.ensure_future(asyncio.sleep(0, b""))
            writing = asyncio.ensure_future(talk(converse, proc.stdin, proc.stdout))
        err = asyncio.ensure_future(read_capped(proc.stderr, cap, over))
        overflow = asyncio.ensure_future(over.wait())
        try:
            await asyncio.wait(
                {proc.exited, overflow}, timeout=self.limits.wall_s, return_when="FIRST_COMPLETED"
            )
            killed = None if proc.exited.done() else ("output" if over.is_set() else "wall")
            kill_group(proc.pid)  # whatever the program left running goes with it
            if reap_uid is not None:  # and what left the group, holding the pipes or not
                await off_loop(kill_uid, reap_uid)
            # a process that escaped both may still hold the pipes: stop waiting soon
            await asyncio.wait({proc.exited, out, err}, timeout=1.0)
            stdout = out.result() if out.done() else b""
            stderr = err.result() if err.done() else b""
        finally:
            for task in (out, err, writing, overflow):
                task.cancel()
        return killed, stdout, stderr


def _status(fd: int) -> int | None:
    """The program's status as the sandbox's pid 1 reported it (None if it did not)."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError, ValueError):
        return int(os.read(fd, 64).decode() or "x")
    return None
