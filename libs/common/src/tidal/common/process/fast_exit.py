"""A service process's last act: run its exit work, then leave without tearing down.

Decision: a service's `__main__` runs `main()` through `run_and_exit`, which, once
`main()` has returned (or raised SystemExit) does everything an ordinary interpreter exit
does that anyone can observe, in the same order, and then ends the process with
`os._exit`:

1. waits for every non-daemon thread and runs the `threading` exit hooks (what
   `threading._shutdown` does at interpreter exit: a `ThreadPoolExecutor` finishing its
   queued work, a checkpoint or publish thread finishing its write);
2. runs the `atexit` functions (logging's own `logging.shutdown` flushes and closes every
   handler; telemetry processors flush);
3. flushes stdout and stderr.

What it skips is the interpreter's teardown after that: deleting every module and
garbage-collecting the heap. For a process that imported torch that teardown costs
0.5-0.9 s of CPU (measured: `import tidal.trainer.main` then exit, 2.7 s wall
against 1.8 s with `os._exit`, docs/benchmarks/startup.md) and frees only memory the
OS takes back anyway, so it was most of a run's shutdown. Nothing durable depends on
it: every file a service writes is written (and fsynced where it matters) by the
service's own code before `main()` returns.

Only the clean exits take this path (a return, SystemExit with an int or None); any
other exception propagates and Python exits as usual, traceback included. A torchrun
rank (`LOCAL_RANK` set) also exits as usual: torch's process-group teardown belongs to
it. `main()` itself is unchanged and stays callable in-process (tests do).
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
