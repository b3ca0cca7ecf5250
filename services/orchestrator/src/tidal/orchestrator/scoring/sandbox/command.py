"""The service-side command of one execution: the child entry (child.py), around
bubblewrap where it is used, every stage at the sandbox's lower CPU priority.

The spec each stage reads is JSON on its argv, so limits are set by the process they
bind and the threaded caller runs no `preexec_fn`. With bubblewrap, the uid switch (as
root) comes before it and the limits are set by its pid 1 inside it; in the fallback one
child does all of it (child.py says in which order, and why).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from tidal.orchestrator.scoring.sandbox.bubblewrap import INIT, bwrap_argv
from tidal.orchestrator.scoring.sandbox.limits import SandboxLimits

CHILD = str(Path(__file__).with_name("child.py"))
# untrusted code, every stage that starts it and its session's autogroup yield the CPU
NICENESS = 10
TMP_FS_FILES = 4  # a private /tmp or /dev/shm holds this many files of the largest size


def sandbox_command(
    lim: SandboxLimits,
    *,
    bwrap: str | None,
    python: str,
    argv: list[str],
    workdir: Path,
    uid: int | None,
    status_fd: int | None,
    read_only: Sequence[str] = (),
) -> list[str]:
    """The service-side command: the child entry, around bubblewrap where it is used."""
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
    if bwrap is None:
        spec = _spec(lim.network, limits, uid, os.getpid(), None, env | {"TMPDIR": str(workdir)})
        return [*entry, spec, *argv]
    env |= {"TMPDIR": "/tmp"}
    inner = [
        python,
        "-I",
        "-S",
        "-B",
        INIT,
        _spec("allow", limits, None, None, status_fd, env),
    ]
    box = bwrap_argv(
        bwrap,
        child=CHILD,
        python=python,
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
