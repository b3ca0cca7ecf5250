"""The lookup task with a slow tool: `lookup(key)` answers after `latency_s` seconds.

A plug-in task (`type = "import"`, path `slow_lookup_task:SlowLookupTask`) for
`bench/tool_latency.py`: everything but the tool's wait is the built-in lookup task. With
`block = prompts_per_step` only every other step's problems wait (train draws are numbered
in order, `block` per step), so one run holds both arms side by side, steps apart, and
load on a shared machine hits both alike. The wait is an `asyncio.sleep`, as a remote
tool's would be.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tidal.orchestrator.task_config import LookupTaskConfig
from tidal.orchestrator.tasks.base import Problem, Tool
from tidal.orchestrator.tasks.lookup import LOOKUP, LookupTask, lookup


def is_slow(uid: str, block: int) -> bool:
    """Whether problem `uid` ("task/split/index") is in a slow block (every block if 0)."""
    return block == 0 or (int(uid.rsplit("/", 1)[1]) // block) % 2 == 1


class SlowLookupTask(LookupTask):
    def __init__(self, latency_s: float = 0.0, block: int = 0, **options: Any) -> None:
        super().__init__(LookupTaskConfig(**options))
        self.latency_s = latency_s
        self.block = block
        self.tools = (Tool(LOOKUP.name, LOOKUP.description, LOOKUP.parameters, self.slow_lookup),)

    async def slow_lookup(self, problem: Problem, key: str) -> str:
        if is_slow(problem.uid, self.block):
            await asyncio.sleep(self.latency_s)
        return await lookup(problem, key)
