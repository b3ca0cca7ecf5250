"""A launched process dies with its launcher (tidal.common.process.launcher_watch), tested with real
processes: a stand-in launcher starts one child, the test SIGKILLs the launcher and
watches the child (by /proc, since the orphan is no child of the test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.common.process.launcher_watch import watch_launcher

# argv: child code, "pdeathsig" | "watch". Prints the child's pid; the child prints "ready".
LAUNCHER = """
import os, subprocess, sys
from tidal.common.process.launcher_watch import launcher_env, parent_death_signal
pdeathsig = sys.argv[2] == "pdeathsig"
env = {k: v for k, v in os.environ.items() if k != "TIDAL_LAUNCHER_PID"}
if not pdeathsig:
    env.update(launcher_env())
child = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1]],
    env=env,
    preexec_fn=parent_death_signal() if pdeathsig else None,
)
print(child.pid, flush=True)
child.wait()
"""

# argv: marker file, "term" | "ignore". Records a SIGTERM in the marker file and exits.
CHILD = """
import signal, sys, threading
from pathlib import Path
from tidal.common.process.launcher_watch import watch_launcher
def on_term(signum, frame):
    Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term if sys.argv[2] == "term" else signal.SIG_IGN)
watch_launcher(poll_s=0.05, kill_after_s=0.5)
print("ready", flush=True)
threading.Event().wait()
"""


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphan's new parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _launch(tmp_path: Path, how: str, on_term: str) -> tuple[subprocess.Popen[str], int]:
    marker = tmp_path / "marker"
    child = f"import sys; sys.argv = ['child', {str(marker)!r}, {on_term!r}]\n{CHILD}"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, child, how], stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    assert launcher.stdout.readline().strip() == "ready"
    return launcher, pid


def _kill_and_wait_for(launcher: subprocess.Popen[str], pid: int, within_s: float) -> bool:
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    gone = not _alive(pid)
    if not gone:
        os.kill(pid, signal.SIGKILL)
    return gone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_parent_death_signal_sends_sigterm_when_the_launcher_is_killed(tmp_path: Path) -> None:
    launcher, pid = _launch(tmp_path, "pdeathsig", on_term="term")
    assert _kill_and_wait_for(launcher, pid, within_s=2.0)
    assert (tmp_path / "marker").read_text() == "SIGTERM"


def test_watchdog_sends_sigterm_when_the_launcher_is_killed(tmp_path: Path) -> None:
    launcher, pid = _launch(tmp_path, "watch", on_term="term")
    assert _kill_and_wait_for(launcher, pid, within_s=2.0)
    assert (tmp_path / "marker").read_text() == "SIGTERM"


def test_watchdog_exits_hard_when_sigterm_does_not_stop_the_process(tmp_path: Path) -> None:
    launcher, pid = _launch(tmp_path, "watch", on_term="ignore")
    assert _kill_and_wait_for(launcher, pid, within_s=3.0)
    assert not (tmp_path / "marker").exists()


def test_watchdog_is_off_in_a_process_nobody_launched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDAL_LAUNCHER_PID", raising=False)
    assert watch_launcher() is False
