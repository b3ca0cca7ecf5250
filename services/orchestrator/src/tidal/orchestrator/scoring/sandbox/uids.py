"""The unprivileged uids executions run as when the service is root: one per execution.

The pool belongs to the process, not to an executor or an event loop: a verifier worker
that scores each completion under its own `asyncio.run` still hands each execution the
uid used least recently, so what one program left behind (processes of a fork bomb not
yet reaped, files it owns) never shares a uid with the next one. Each process draws from
its own range (derived from its pid), so concurrent workers never share one either.
"""

from __future__ import annotations

import os
import threading
from collections import deque

UID_BASE = 1_000_000
UIDS_PER_PROCESS = 256
PID_SPAN = 1 << 22  # the kernel's largest pid_max


class UidPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._free: deque[int] = deque()

    def take(self) -> int | None:
        """A uid no live execution of this process holds, least recently used first; None
        unless root (there is no uid to switch to)."""
        if os.geteuid() != 0:
            return None
        with self._lock:
            if self._pid != os.getpid():  # a forked worker starts its own range
                self._pid = os.getpid()
                base = UID_BASE + (self._pid % PID_SPAN) * UIDS_PER_PROCESS
                self._free = deque(range(base, base + UIDS_PER_PROCESS))
            if not self._free:
                raise RuntimeError(f"more than {UIDS_PER_PROCESS} sandboxed executions at once")
            return self._free.popleft()

    def give_back(self, uid: int | None) -> None:
        if uid is None:
            return
        with self._lock:
            if self._pid == os.getpid():
                self._free.append(uid)


UIDS = UidPool()
