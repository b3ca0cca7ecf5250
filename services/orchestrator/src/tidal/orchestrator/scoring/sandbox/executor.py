"""Run untrusted code confined: limits, a fresh work dir, the deadline, nothing left behind.

Where bubblewrap is installed and usable (probed once per process), each execution runs in
its own namespaces (bubblewrap.py): it sees none of the run, has a private /tmp and
/dev/shm and no network, and every process it started dies when it ends. Elsewhere the
fallback is a confined child process (child.py) in its own session with rlimits and, as
root, its own uid; a warning at start names what that leaves open. In both, as root the
program runs as an unprivileged uid no other execution holds (uids.py), and the
deadline, the output cap and the concurrency bound are enforced here, in the caller's
process, which never runs the code itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.sandbox.bubblewrap import INIT, bwrap_argv, find_bwrap
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

log = logging.getLogger(__name__)
CHILD = str(Path(__file__).with_name("child.py"))
PROGRAM_FILE = "main.py"
FALLBACK_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")
# untrusted code, every stage that starts it and its session's autogroup yield the CPU
NICENESS = 10
TMP_FS_FILES = 4  # a private /tmp or /dev/shm holds this many files of the largest size
FALLBACK_WARNING = (
    "sandbox: bubblewrap is %s; untrusted code runs in the fallback child process, which "
    "is weaker: no mount namespace (files it writes to /tmp, /dev/shm or beside its work "
    "dir outlive it, and it reads whatever its uid may read), no pid namespace (a process "
    "that leaves its session survives the run%s)%s. Install bubblewrap (make setup, the "
    "orchestrator image) to close these."
)


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


_PROBED: dict[tuple[str, str], str | None] = {}


def _probe_bwrap(sandbox: Sandbox) -> str | None:
    """Why bubblewrap cannot run a program here, or None when it can: one real execution
    (as the service's uid would run it), once per process and interpreter."""
    assert sandbox.bwrap is not None
    key = (sandbox.bwrap, sandbox.python)
    if key not in _PROBED:
        uid = UIDS.take()
        root, workdir = _make_workdir(uid)
        read, write = os.pipe()
        try:
            argv = [sandbox.python, "-I", "-S", "-c", "print('ok')"]
            command = sandbox._command(argv, workdir, uid, write)
            done = subprocess.run(
                command,
                capture_output=True,
                timeout=30,
                pass_fds=(write,),
                check=False,
            )
            os.close(write)
            write = -1
            ok = done.stdout == b"ok\n" and os.read(read, 64) == b"0\n"
            why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
            _PROBED[key] = None if ok else f"unusable ({why})"
        except (OSError, subprocess.TimeoutExpired) as exc:
            _PROBED[key] = f"unusable ({exc})"
        finally:
            for fd in (read, write):
                if fd >= 0:
                    os.close(fd)
            shutil.rmtree(root, ignore_errors=True)
            UIDS.give_back(uid)
    return _PROBED[key]


def _remove_workdir(prepared: tuple[Path, Path, list[str]]) -> None:
    shutil.rmtree(prepared[0], ignore_errors=True)


def _clean_up(root: Path | None, uid: int | None) -> None:
    """Remove an execution's files, then free its uid for another execution."""
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
    UIDS.give_back(uid)


def _make_workdir(uid: int | None) -> tuple[Path, Path]:
    """A fresh `<root>/work`: the program may write in work, never in root (as root, the
    uid cannot; in bubblewrap, root is a private directory of the sandbox's /tmp)."""
    root = Path(tempfile.mkdtemp(prefix="tidal-sandbox-"))
    root.chmod(0o711)
    workdir = root / "work"
    workdir.mkdir()
    if uid is not None:
        os.chown(workdir, uid, uid)
    return root, workdir


class Sandbox:
    """An executor with its limits and a bound on concurrent executions."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.python = python_for_programs(self.limits.python)
        self.bwrap = self._choose_bwrap()
        self._gate: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _choose_bwrap(self) -> str | None:
        """bubblewrap's path when executions use it, chosen once; warns about the fallback."""
        mode = self.limits.isolation
        if mode == "process":
            return None
        self.bwrap = find_bwrap()
        if self.bwrap is None:
            why: str | None = "not installed"
        else:
            interpreter = self.python
            self.python = os.path.realpath(interpreter)  # a venv's base: the venv is not mounted
            why = _probe_bwrap(self)
            if why is None:
                return self.bwrap
            self.python, self.bwrap = interpreter, None
        if mode == "bubblewrap":
            raise ConfigError(f"sandbox isolation = 'bubblewrap', but bubblewrap is {why}")
        root = os.geteuid() == 0
        survive = ", until its uid is reaped after the run" if root else ", for good"
        user = (
            ""
            if root
            else (
                "; not root, so it runs as the service's user: it can read the run's TLS keys "
                "and write the run folder"
            )
        )
        log.warning(FALLBACK_WARNING, why, survive, user)
        return None

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
                    self._prepare, program, files or {}, uid, abandon=_remove_workdir
                )
                data = stdin.encode() if isinstance(stdin, str) else stdin
                return await self._execute(argv, workdir, uid, data, converse, read_only)
            finally:
                await off_loop(_clean_up, root, uid)

    def _prepare(
        self, program: str | Sequence[str], files: Mapping[str, str], uid: int | None
    ) -> tuple[Path, Path, list[str]]:
        """A fresh work dir holding `files` (and the program's source) as `uid`, and the
        program's argv."""
        if isinstance(program, str):
            files = {**files, PROGRAM_FILE: program}
            argv = [self.python, "-I", "-S", "-B", PROGRAM_FILE]
        else:
            argv = list(program)
        root, workdir = _make_workdir(uid)
        try:
            for name, text in files.items():
                path = workdir / name
                if workdir not in path.resolve().parents:
                    raise ValueError(f"sandbox file {name!r} is outside the work dir")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            if uid is not None:
                for path in [workdir, *workdir.rglob("*")]:
                    os.chown(path, uid, uid)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return root, workdir, argv

    def _command(
        self,
        argv: list[str],
        workdir: Path,
        uid: int | None,
        status_fd: int | None,
        read_only: Sequence[str] = (),
    ) -> list[str]:
        """The service-side command: the child entry, around bubblewrap where it is used."""
        lim = self.limits
        limits = {
            "cpu_s": lim.cpu_s,
            "memory_bytes": lim.memory_mb << 20,
            "file_size_bytes": lim.file_size_mb << 20,
            "processes": lim.processes,
            "open_files": lim.open_files,
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8"}
        lower = _lower()
        entry = [*lower, sys.executable, "-I", "-S", "-B", CHILD]
        if self.bwrap is None:
            spec = _spec(
                lim.network, limits, uid, os.getpid(), None, env | {"TMPDIR": str(workdir)}
            )
            return [*entry, spec, *argv]
        env |= {"TMPDIR": "/tmp"}
        inner = [
            self.python,
            "-I",
            "-S",
            "-B",
            INIT,
            _spec("allow", limits, None, None, status_fd, env),
        ]
        box = bwrap_argv(
            self.bwrap,
            child=CHILD,
            python=self.python,
            workdir=workdir,
            tmp_bytes=TMP_FS_FILES * (lim.file_size_mb << 20),
            share_network=lim.network == "allow",
            read_only=read_only,
        )
        # bwrap's --die-with-parent ties it to the executor; before it only the uid changes
        if uid is None:
            return [*lower, *box, *inner, *argv]
        outer = _spec("allow", None, uid, os.getpid(), None, env)
        return [*entry, outer, *box, *inner, *argv]

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
                self._command(argv, workdir, uid, status[1] if status else None, read_only),
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


def _spec(
    network: str,
    limits: dict[str, int] | None,
    uid: int | None,
    parent_pid: int | None,
    status_fd: int | None,
    env: dict[str, str],
) -> str:
    return json.dumps(
        {
            "network": network,
            "limits": limits,
            "uid": uid,
            "parent_pid": parent_pid,
            "status_fd": status_fd,
            "env": env,
        }
    )


def _lower() -> list[str]:
    """The prefix that starts a command at the sandbox's lower CPU priority."""
    nice = shutil.which("nice", path="/usr/bin:/bin")
    return [nice, "-n", str(NICENESS)] if nice else []


def _status(fd: int) -> int | None:
    """The program's status as the sandbox's pid 1 reported it (None if it did not)."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError, ValueError):
        return int(os.read(fd, 64).decode() or "x")
    return None
