"""Tools' schemas are checked in a worker process of the replica: its errors name the
field, a list that passed is not checked again, a worker that died is replaced, and the
worker dies with the replica."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tidal.common.errors import InvalidArgument, Unavailable
from tidal.inference.openai.schema_checks import SchemaChecks

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}
BAD = {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}


def _started(before: set[Any]) -> Any:
    (worker,) = set(multiprocessing.active_children()) - before
    return worker


def test_a_bad_schema_is_named_and_a_list_that_passed_is_not_checked_again() -> None:
    before = set(multiprocessing.active_children())
    checks = SchemaChecks()
    try:
        with pytest.raises(InvalidArgument) as caught:
            asyncio.run(checks.check([LOOKUP, BAD]))
        assert caught.value.field == "tools[1].function.parameters"
        assert "is not a valid JSON schema" in str(caught.value)
        assert _started(before).pid != os.getpid()
        asyncio.run(checks.check([LOOKUP]))
    finally:
        checks.close()
    asyncio.run(checks.check([LOOKUP]))  # remembered: no worker is started for it
    assert not checks.running


def test_a_worker_that_died_is_a_503_and_the_next_check_starts_another() -> None:
    before = set(multiprocessing.active_children())
    checks = SchemaChecks()
    try:
        asyncio.run(checks.check([LOOKUP]))
        worker = _started(before)
        worker.kill()
        worker.join()
        with pytest.raises(Unavailable):
            asyncio.run(checks.check([BAD]))
        with pytest.raises(InvalidArgument):  # a fresh worker
            asyncio.run(checks.check([BAD]))
    finally:
        checks.close()


REPLICA = """
import asyncio, multiprocessing, time
from tidal.inference.openai.schema_checks import SchemaChecks
checks = SchemaChecks()
asyncio.run(checks.check([{"type": "function", "function": {"name": "f"}}]))
(worker,) = multiprocessing.active_children()
print(worker.pid, flush=True)
time.sleep(60)
"""


def test_the_worker_dies_with_a_killed_replica() -> None:
    replica = subprocess.Popen([sys.executable, "-c", REPLICA], stdout=subprocess.PIPE, text=True)
    try:
        assert replica.stdout is not None
        worker = int(replica.stdout.readline())
    finally:
        replica.send_signal(signal.SIGKILL)
        replica.wait()
    deadline = time.monotonic() + 10
    try:
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
