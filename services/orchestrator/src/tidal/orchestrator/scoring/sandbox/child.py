"""The sandbox's child entry: confine this process, then become the target program.

Run as `python -I -S child.py SPEC_JSON ARGV...` in a new session, so the limits are set
by the process they bind and no `preexec_fn` runs in the (threaded) parent. Standard
library only: it runs before anything else is importable. Order matters: the network
namespace needs privilege, so it comes before the uid switch; the parent-death signal is
cleared by a credential change, so it comes after.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
EXIT_SETUP_FAILED = 125
NICENESS = 10  # untrusted code yields the CPU to the services


def fail(message: str) -> None:
    os.write(2, f"tidal-sandbox: {message}\n".encode())
    os._exit(EXIT_SETUP_FAILED)


def isolate_network(libc: ctypes.CDLL, mode: str) -> None:
    """A fresh network namespace holds only a down loopback: no socket reaches anything."""
    if mode == "allow":
        return
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        why = os.strerror(ctypes.get_errno())
        if mode == "isolate":
            fail(f"cannot create a network namespace ({why}); network = 'isolate' needs it")
        os.write(2, f"tidal-sandbox: network not isolated ({why})\n".encode())


def set_limits(spec: dict) -> None:
    # SIGXCPU at the soft CPU limit says why it ended; SIGKILL a second later if ignored
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1))
    limits = {
        resource.RLIMIT_AS: spec["memory_bytes"],
        resource.RLIMIT_FSIZE: spec["file_size_bytes"],
        resource.RLIMIT_NPROC: spec["processes"],
        resource.RLIMIT_NOFILE: spec["open_files"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


def drop_privileges(uid: int | None) -> None:
    if uid is None:
        return
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except OSError as exc:
        fail(f"cannot switch to uid {uid}: {exc}")


def main() -> None:
    spec = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    isolate_network(libc, spec["network"])
    set_limits(spec)
    os.nice(NICENESS)
    drop_privileges(spec["uid"])
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != spec["parent_pid"]:
        os._exit(EXIT_SETUP_FAILED)  # the parent died before the signal was armed
    try:
        os.execve(argv[0], argv, spec["env"])
    except OSError as exc:
        fail(f"cannot run {argv[0]}: {exc}")


if __name__ == "__main__":
    main()
