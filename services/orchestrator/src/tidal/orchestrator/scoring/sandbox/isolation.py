"""Which confinement this process's executions get, chosen once: bubblewrap where it is
installed and a real execution through it works, else the fallback child with a warning
naming what that leaves open; and the interpreter that runs source programs.

The probe runs once per process and interpreter, as the service's uid would run a
program, so an installed but unusable bubblewrap (no user namespaces) is found at start
rather than at the first tool call. `isolation = "bubblewrap"` turns its absence into a
ConfigError.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.sandbox.bubblewrap import find_bwrap
from tidal.orchestrator.scoring.sandbox.command import sandbox_command
from tidal.orchestrator.scoring.sandbox.limits import SandboxLimits
from tidal.orchestrator.scoring.sandbox.uids import UIDS
from tidal.orchestrator.scoring.sandbox.workdir import make_workdir

log = logging.getLogger(__name__)
FALLBACK_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")
FALLBACK_WARNING = (
    "sandbox: bubblewrap is %s; untrusted code runs in the fallback child process, which "
    "is weaker: no mount namespace (files it writes to /tmp, /dev/shm or beside its work "
    "dir outlive it, and it reads whatever its uid may read), no pid namespace (a process "
    "that leaves its session survives the run%s)%s. Install bubblewrap (make setup, the "
    "orchestrator image) to close these."
)


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


def _probe_bwrap(bwrap: str, python: str, limits: SandboxLimits) -> str | None:
    """Why bubblewrap cannot run a program here, or None when it can: one real execution
    (as the service's uid would run it), once per process and interpreter."""
    key = (bwrap, python)
    if key not in _PROBED:
        uid = UIDS.take()
        root, workdir = make_workdir(uid)
        read, write = os.pipe()
        try:
            argv = [python, "-I", "-S", "-c", "print('ok')"]
            command = sandbox_command(
                limits,
                bwrap=bwrap,
                python=python,
                argv=argv,
                workdir=workdir,
                uid=uid,
                status_fd=write,
            )
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


def choose_isolation(limits: SandboxLimits, python: str) -> tuple[str | None, str]:
    """(bubblewrap's path when executions use it, the programs' interpreter), chosen once;
    warns about the fallback."""
    mode = limits.isolation
    if mode == "process":
        return None, python
    bwrap = find_bwrap()
    if bwrap is None:
        why: str | None = "not installed"
    else:
        real = os.path.realpath(python)  # a venv's base: the venv is not mounted
        why = _probe_bwrap(bwrap, real, limits)
        if why is None:
            return bwrap, real
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
    return None, python
