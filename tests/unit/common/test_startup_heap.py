"""`settle_startup_heap`: start-up's objects leave the collector's walk, later garbage does not."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, weakref
from tidal.common.process.service_start import settle_startup_heap

class Node:
    pass

before = Node(); before.self = before  # a cycle alive at start-up
settle_startup_heap()
frozen = gc.get_freeze_count()
assert frozen > 1000, frozen  # the imports and `before` are out of the walk
assert not any(o is before for o in gc.get_objects())
after = Node(); after.self = after  # garbage made while serving
gone = weakref.ref(after)
del after
gc.collect()
assert gone() is None, "a cycle made after start-up was not collected"
print("ok", frozen)
"""


def test_startup_objects_are_frozen_and_later_cycles_still_collected() -> None:
    # In a child process: freezing the test runner's own heap would outlive the test.
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
