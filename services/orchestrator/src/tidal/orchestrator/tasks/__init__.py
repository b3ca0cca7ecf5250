"""Verifiable tasks: where prompts come from and how completions are scored."""

from __future__ import annotations

from tidal.orchestrator.config import ReversalTaskConfig
from tidal.orchestrator.tasks.base import Problem, Task
from tidal.orchestrator.tasks.reversal import ReversalTask

__all__ = ["Problem", "ReversalTask", "Task", "build_task"]


def build_task(config: ReversalTaskConfig) -> Task:
    """The task a config names (a discriminated union on `type` once there are more)."""
    return ReversalTask(config)
