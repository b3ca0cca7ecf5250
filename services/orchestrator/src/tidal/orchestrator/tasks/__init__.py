"""Verifiable tasks: where prompts come from and how completions are scored."""

from __future__ import annotations

from tidal.orchestrator.tasks.base import (
    EnvReply,
    GeneratedTask,
    Problem,
    Split,
    Task,
    Verdict,
)
from tidal.orchestrator.tasks.registry import build_task, build_tasks
from tidal.orchestrator.tasks.reversal import ReversalTask

__all__ = [
    "EnvReply",
    "GeneratedTask",
    "Problem",
    "ReversalTask",
    "Split",
    "Task",
    "Verdict",
    "build_task",
    "build_tasks",
]
