"""How the suite shares one machine among pytest-xdist workers (`make test` runs `-n N`).

The suite brings its own scheduler (GroupScheduling), whose unit of work is a group:

- a test module, so a module- or session-scoped fixture (a torchrun job, a built model
  folder) runs once per module, as in a serial run;
- the sandbox modules together: the attack tests assert that no process of any sandbox
  uid outlives them, which another worker's sandboxed program would break;
- the tests whose latency or wall-clock bound another worker's load would move them past
  (ALONE): they run last, one after another, each with the machine to itself (an
  exclusive lock that every other test holds shared).

The slow modules go to the front of the queue so the longest cases start first instead
of ending the run alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from xdist.scheduler import LoadScopeScheduling

SANDBOX_MODULES = frozenset(
    {
        "test_attacks.py",
        "test_executor.py",
        "test_hostile_programs.py",
        "test_isolation.py",
        "test_code_task.py",
        "test_code_task_run.py",
        "test_agent_episodes.py",
        "test_agent_gateway_run.py",
        "test_agent_gateway_resume.py",
    }
)
"""Modules whose tests run programs as sandbox uids (by file name: modules move)."""

ALONE = frozenset(
    {
        # p99 of health checks under 150 ms while 64 sandboxed programs spin
        "test_executor.py::test_health_answers_while_64_executions_run",
        # a 0.5 s wall deadline observed within 2 s
        "test_executor.py::test_the_deadline_kills_the_whole_process_group",
        # an escaped process holding the pipes is reaped: the run returns within 3 s
        "test_isolation.py::test_the_fallback_as_root_kills_what_left_the_session",
        # three 0.3 s tool calls within 0.8 s
        "test_tool_episodes.py::test_calls_of_one_turn_run_concurrently",
        # a hung verifier (30 s) does not hold a batch: it ends within 10 s
        "test_verifier_pool.py::test_failures_are_contained_and_counted_by_kind",
        # a refused dial answered within 1 s, a silent one between 0.3 and 2 s
        "test_channel.py::test_a_refused_connection_names_the_service_and_address_at_once",
        "test_channel.py::test_an_address_where_nothing_answers_fails_after_the_timeout",
        # a refusal within 1 s and gRPC health within 100 ms while tools are checked
        "test_openai_tools.py::test_a_hundred_thousand_tools_are_refused_at_once_and_health_answers_meanwhile",
        "test_openai_tools.py::test_more_tools_than_the_limit_is_a_400_naming_it_before_any_is_checked",
        "test_openai_tools.py::test_tool_schemas_are_checked_off_the_event_loop",
        # the disk must fill while the run still has steps to go
        "test_full_disk.py::test_a_full_disk_stops_the_run_once_and_resume_finishes_it",
        # other RPCs answered within half of a slow disk's hold
        "test_weightsync_service.py::test_other_rpcs_are_answered_while_a_fetch_waits_on_a_slow_disk",
        # a child started in a fresh interpreter stops within 2-3 s of its launcher's death
        "test_launcher_watch.py::test_parent_death_signal_sends_sigterm_when_the_launcher_is_killed",
        "test_launcher_watch.py::test_watchdog_exits_hard_when_sigterm_does_not_stop_the_process",
    }
)
"""Tests (file name::function) whose timing bound needs the machine to itself."""

SANDBOX_GROUP = "sandbox"
ALONE_GROUP = "alone"


def group_of(nodeid: str) -> str:
    """The group of a test by its node id: ALONE, the sandbox modules, else its module."""
    module, _, rest = nodeid.partition("::")
    name = module.rsplit("/", 1)[-1]
    if f"{name}::{rest.split('[', 1)[0]}" in ALONE:
        return ALONE_GROUP
    if name in SANDBOX_MODULES:
        return SANDBOX_GROUP
    return module


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with `group_of` as the scope, in the order the workers
    collected (`order_for_workers`)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def order_for_workers(items: list[pytest.Item]) -> None:
    """Slow modules first, the ALONE tests last, collection order otherwise (stable)."""
    slow = {i.path for i in items if i.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        if group_of(item.nodeid) == ALONE_GROUP:
            return 2
        return 0 if item.path in slow else 1

    items.sort(key=rank)


class MachineShare:
    """A readers-writer lock over the workers of one run: every test holds it shared, an
    ALONE test exclusively. A turnstile lock in front lets an ALONE test that waits stop
    new tests from starting, so it waits only for the ones already running."""

    def __init__(self, folder: Path) -> None:
        self._gate: IO[str] = (folder / "machine-gate.lock").open("a")
        self._machine: IO[str] = (folder / "machine.lock").open("a")

    @contextlib.contextmanager
    def hold(self, *, alone: bool) -> Iterator[None]:
        if alone:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            fcntl.flock(self._machine, fcntl.LOCK_EX)
        else:
            fcntl.flock(self._gate, fcntl.LOCK_SH)  # waits while an ALONE test waits
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            fcntl.flock(self._machine, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._machine, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)


@functools.cache
def machine_share(run_folder: Path) -> MachineShare:
    """This worker's handle on the lock of the run whose workers share `run_folder`."""
    return MachineShare(run_folder)
