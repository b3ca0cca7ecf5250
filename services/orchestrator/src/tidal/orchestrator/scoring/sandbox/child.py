"""The sandbox's child entry: confine this process, then become (or start) the target program.

Run as `python -I -S child.py SPEC_JSON ARGV...`, so limits are set by the process they
bind and no `preexec_fn` runs in the threaded parent; standard library only (it also runs
inside bubblewrap). The spec picks its role: the whole fallback confinement; the uid
switch alone before bubblewrap (as root, so the program never counts against root's
unlimited processes); pid 1 inside bubblewrap (limits set inside the user namespace,
then the program as a child; when it ends, pid 1 reports its status and exits, and the
kernel kills what is left). Order matters: the network namespace needs privilege, so it
precedes the uid switch, and a credential change clears the parent-death signal, so
that comes after (docs/agents.md).
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


def set_limits(limits: dict) -> None:
    # SIGXCPU at the soft CPU limit says why it ended; SIGKILL a second later if ignored
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    caps = {
        resource.RLIMIT_AS: limits["memory_bytes"],
        resource.RLIMIT_FSIZE: limits["file_size_bytes"],
        resource.RLIMIT_NPROC: limits["processes"],
        resource.RLIMIT_NOFILE: limits["open_files"],
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NICE: 0,  # no lowering of the nice value it was started with
    }
    for which, value in caps.items():
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


def run_as_init(argv: list[str], env: dict, status_fd: int) -> None:
    """Pid 1 of the sandbox: start the program, reap orphans until it ends, report its status
    (negative for a signal) on `status_fd`, which the program never holds."""
    program = os.fork()
    if program == 0:
        os.close(status_fd)
        try:
            os.execve(argv[0], argv, env)
        except OSError as exc:
            fail(f"cannot run {argv[0]}: {exc}")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(EXIT_SETUP_FAILED)
        if pid == program:
            break
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    os.write(status_fd, f"{code}\n".encode())
    os._exit(0)  # the kernel now kills whatever the program left in the namespace


def main() -> None:
    spec = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    isolate_network(libc, spec["network"])
    if spec["limits"] is not None:
        set_limits(spec["limits"])
    drop_privileges(spec["uid"])
    if spec["parent_pid"] is not None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != spec["parent_pid"]:
            os._exit(EXIT_SETUP_FAILED)  # the parent died before the signal was armed
    if spec["status_fd"] is not None:
        run_as_init(argv, spec["env"], spec["status_fd"])
    try:
        os.execve(argv[0], argv, spec["env"])
    except OSError as exc:
        fail(f"cannot run {argv[0]}: {exc}")


if __name__ == "__main__":
    main()
