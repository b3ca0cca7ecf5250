"""Bring up the loopback interface inside a sandboxed agent's own network namespace.

The fallback sandbox (no bubblewrap, which raises `lo` itself) puts the agent in a fresh
network namespace whose only interface, `lo`, is down, and drops its privileges before the
agent runs, so it cannot raise `lo` itself. Its launcher reaches the gateway through a
Unix socket (a path: it crosses namespaces) and asks for loopback; the gateway, privileged,
enters the namespace of the process at the other end of that socket (SO_PEERCRED) on a
thread of its own and sets `lo` up. That namespace then
reaches its own 127.0.0.1 and nothing else: no host port, so no gRPC service.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


class LoopbackError(Exception):
    """The namespace's loopback could not be raised (not privileged, process gone)."""


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def _raise_lo(pid: int, errors: list[str]) -> None:
    """Runs on a thread that exits afterwards: setns moves only the calling thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    except OSError as exc:
        errors.append(f"cannot open the namespace of pid {pid}: {exc.strerror}")
        return
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errors.append(f"setns: {os.strerror(ctypes.get_errno())}")
            return
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sh", b"lo", 0)
            flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
    except OSError as exc:
        errors.append(f"cannot raise lo: {exc.strerror}")
    finally:
        os.close(fd)


def same_namespace(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def raise_loopback(pid: int) -> None:
    """Set `lo` up in `pid`'s network namespace; LoopbackError saying why not. Blocking
    (a thread start and two ioctls): call it off the event loop."""
    if same_namespace(pid):
        return  # the host's namespace: its loopback is up, and not ours to touch
    errors: list[str] = []
    # a fresh thread, never a pooled one: it ends inside the agent's namespace
    thread = threading.Thread(target=_raise_lo, args=(pid, errors), name="tidal-loopback")
    thread.start()
    thread.join()
    if errors:
        raise LoopbackError(errors[0])
