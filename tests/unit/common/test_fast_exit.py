"""run_and_exit: a clean exit still finishes threads and atexit work, then skips teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
from tidal.common.process.fast_exit import run_and_exit

out = Path(sys.argv[1])

def main():
    def late_write():  # a non-daemon thread still writing when main returns
        time.sleep(0.3)
        (out / "thread").write_text("written")
    threading.Thread(target=late_write).start()
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    print("buffered", end="")  # no newline: only a flush gets it out
    raise SystemExit({code!r})

run_and_exit(main)
"""


def _run(tmp_path: Path, code: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(code=code), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_clean_exit_joins_threads_runs_atexit_flushes_and_keeps_the_code(tmp_path: Path) -> None:
    done = _run(tmp_path, 3)
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "thread").read_text() == "written"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert done.stdout == "buffered"


def test_a_message_exit_takes_pythons_own_path(tmp_path: Path) -> None:
    done = _run(tmp_path, "config is broken")
    assert done.returncode == 1
    assert "config is broken" in done.stderr
    assert (tmp_path / "thread").read_text() == "written"
