"""The bubblewrap command line of one execution: what the program sees of the host.

bubblewrap (`bwrap`, no setuid bit needed where unprivileged user namespaces are on) puts
the program in new user, mount, pid, network, ipc, uts and cgroup namespaces. Its file
system is built from nothing: the system's programs and libraries read-only, a few
files of /etc, a fresh /proc and /dev, size-bounded private /tmp and /dev/shm, and the
execution's work dir, the one writable place that outlives it (until the executor
removes it), and, read-only, the host paths its caller lends it (an agent's program
files, the gateway's socket folder). The run folder, TLS keys, home folders and every
other service file are simply absent, whatever uid the service runs as. It keeps the
session the executor started (no terminal to inject into): one session, one autogroup,
whose CPU priority the executor lowers (processes.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

INIT = "/run/tidal-sandbox/child.py"
"""Where the child entry is mounted inside the sandbox."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/passwd",
    "/etc/group",
)


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _system_mounts(python: str) -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # a merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    prefix = Path(os.path.realpath(python)).parents[1]  # <prefix>/bin/python3
    if not any(str(prefix).startswith(d + "/") or str(prefix) == d for d in SYSTEM_DIRS):
        args += ["--ro-bind", str(prefix), str(prefix)]  # an interpreter outside /usr
    return args


def bwrap_argv(
    bwrap: str,
    *,
    child: str,
    python: str,
    workdir: Path,
    tmp_bytes: int,
    share_network: bool,
    read_only: Sequence[str] = (),
) -> list[str]:
    """bwrap's argv up to (and including) `--`; the command to run inside follows it.
    `read_only`: host paths the caller lends the program, mounted read-only where they are."""
    size = str(tmp_bytes)
    lent = [arg for path in read_only for arg in ("--ro-bind", path, path)]
    return [
        bwrap,
        "--unshare-all",
        *(["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
          if share_network else []),
        "--die-with-parent",  # bwrap and everything inside die with the executor's child
        "--as-pid-1",  # the child entry is pid 1: the namespace ends when the program does
        "--cap-drop", "ALL",
        *_system_mounts(python),
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", size, "--tmpfs", "/tmp",
        "--size", size, "--tmpfs", "/dev/shm",
        "--bind", str(workdir), str(workdir),  # after /tmp: its parents are private too
        *lent,  # after /tmp too: a lent path under it shows alone, its siblings absent
        "--ro-bind", child, INIT,
        "--chdir", str(workdir),
        "--",
    ]  # fmt: skip
