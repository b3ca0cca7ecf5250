"""A launched service dies with its `tidal rl` launcher, even a SIGKILLed one.

Two layers: on Linux the launcher forks each child with a parent-death signal (SIGTERM, so
the child shuts down gracefully); everywhere, each service and torchrun rank started with
`TIDAL_LAUNCHER_PID` runs a watchdog that sends itself SIGTERM once the launcher is gone
and exits hard if that does not end it (docs/operations.md, "Supervision and restarts").
A service's own worker processes die with it the same way (`die_with_parent`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

LAUNCHER_PID_ENV = "TIDAL_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5
KILL_AFTER_S = 10.0
EXIT_ORPHANED = 1


def parent_death_signal(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` making the child receive `sig` when this process dies; None where
    the OS has no parent-death signal (the child's `watch_launcher` covers it there)."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "parent_death_signal: fork from the main thread; PR_SET_PDEATHSIG fires when "
            "the forking thread exits, not the process"
        )
    prctl = _prctl()  # looked up here, before the fork: the child only calls it
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(EXIT_ORPHANED)  # cannot be tied to the launcher: do not run untied
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(EXIT_ORPHANED)

    return set_parent_death_signal


def die_with_parent(parent: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """In a child already running (a process pool's initializer): receive `sig` once the
    thread that started this process ends, and exit at once if `parent` is already gone.
    A no-op where the OS has no parent-death signal."""
    if not sys.platform.startswith("linux"):
        return
    if _prctl()(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0 or os.getppid() != parent:
        os._exit(EXIT_ORPHANED)


def _prctl() -> Callable[..., int]:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def launcher_env() -> dict[str, str]:
    """The environment entry that makes a child's `watch_launcher` watch this process."""
    return {LAUNCHER_PID_ENV: str(os.getpid())}


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_launcher(*, poll_s: float = POLL_S, kill_after_s: float = KILL_AFTER_S) -> bool:
    """In a launched process (`TIDAL_LAUNCHER_PID` set): start the watchdog thread that
    stops this process when the launcher is gone. Returns whether it was started."""
    value = os.environ.get(LAUNCHER_PID_ENV)
    if not value:
        return False
    launcher = int(value)
    parent = os.getppid()

    def gone() -> bool:
        return os.getppid() != parent or not _pid_exists(launcher)

    def watch() -> None:
        tick = threading.Event()  # never set: a sleep that is not a busy loop
        while not gone():
            tick.wait(poll_s)
        log.warning("launcher (pid %d) is gone; shutting down", launcher)
        os.kill(os.getpid(), signal.SIGTERM)
        tick.wait(kill_after_s)
        log.error("still running %.0fs after the launcher died; exiting", kill_after_s)
        logging.shutdown()
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()
    return True
