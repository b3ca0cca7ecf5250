"""A launched service's lifeline: it dies with the `tidal rl` launcher, even a SIGKILLed one.

The launcher runs each service in its own session, so a terminal's Ctrl-C reaches only
the launcher, which then stops its children in order. But a launcher killed with
SIGKILL (or by the OOM killer) runs no cleanup, and its children would keep running and
holding their ports. Two layers make sure they do not:

- Linux: a parent-death signal. The launcher forks each child with a preexec_fn
  (`parent_death_signal`) that calls `prctl(PR_SET_PDEATHSIG, SIGTERM)` between fork and
  exec, through ctypes (no dependency: python-prctl needs a compiler and libcap headers,
  and the call is one line). The kernel then delivers SIGTERM the moment the launcher
  dies, however it dies, with no polling. It survives exec (our children are plain
  `python -m tidal.<service>`, never set-uid).
  - SIGTERM, not SIGKILL: the child takes its ordinary graceful path (health
    NOT_SERVING, `server.stop(grace)`, close hooks), and a torchrun agent (the trainer
    with `world_size` > 1 execs into one) forwards SIGTERM to its ranks, where a
    SIGKILLed agent would orphan them.
  - PDEATHSIG fires when the *thread* that forked the child exits, not the process. The
    launcher forks from its main thread (the thread `asyncio.run` runs the loop on),
    which lives as long as the process; `parent_death_signal` refuses any other thread.
  - The launcher may die between fork and prctl; the child then sees a parent pid other
    than the launcher's (recorded before the fork) and exits before exec.
- Everywhere, also a watchdog (`watch_launcher`), started by every service and every
  torchrun rank (the launcher's pid travels in `TIDAL_LAUNCHER_PID`, which torchrun passes
  on). A daemon thread checks every `POLL_S` whether the launcher is gone: the process's
  parent changed (it was reparented: this happens at the parent's death, before anyone
  reaps it) or the launcher's pid no longer exists. Then it sends its own process SIGTERM
  (the graceful path; this is the only trigger where PDEATHSIG does not exist, e.g.
  macOS) and, if the process still lives `KILL_AFTER_S` later (a stuck shutdown, or a
  torchrun follower rank, which ignores SIGTERM and waits for rank 0), exits hard with
  `os._exit`. It is the launcher's own "SIGKILL after a grace period", which a dead
  launcher cannot perform. Polling a pid every half second costs nothing measurable;
  pidfd/kqueue would avoid it but differ per OS.
- Opt-in by environment: a service started by hand (`tidal inference @ cfg`, perhaps
  under nohup) has no `TIDAL_LAUNCHER_PID` and outlives its shell as before.
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
    # Looked up here, before the fork: the child only calls it.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(EXIT_ORPHANED)  # cannot be tied to the launcher: do not run untied
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(EXIT_ORPHANED)

    return set_parent_death_signal


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
