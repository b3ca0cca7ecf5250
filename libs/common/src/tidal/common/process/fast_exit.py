"""A service process's last act: run its exit work, then leave without tearing down.

`run_and_exit(main)` does what an interpreter exit does that anyone can observe (joins
non-daemon threads, runs the `atexit` hooks, flushes stdio), then `os._exit`: the module
and heap teardown it skips frees only memory the OS takes back. Only clean exits take
this path; other exceptions and torchrun ranks exit as usual (docs/architecture.md).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable


def run_and_exit(main: Callable[[], object]) -> None:
    """Run `main()`; on a clean exit do the exit work above and `os._exit` its code."""
    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            raise  # a message to print: Python's own exit prints it
        code = exc.code or 0
    if "LOCAL_RANK" in os.environ or not _finish_threads():
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to save
            stream.flush()
    os._exit(code)


def _finish_threads() -> bool:
    """Join the non-daemon threads as interpreter exit would; False if this Python has no
    `threading._shutdown` (then the caller exits the ordinary way)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None or threading.current_thread() is not threading.main_thread():
        return False
    shutdown()
    return True
