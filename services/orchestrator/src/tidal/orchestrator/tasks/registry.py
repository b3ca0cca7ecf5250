"""Build tasks from their configs: built-ins by `type`, plug-ins by import path.

A plug-in path that cannot be imported, or that names something other than a `Task`
subclass, is a `ConfigError` raised before the run starts, listing the built-in types
and the expected form, so the fix is obvious from the message.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from tidal.common.errors import ConfigError
from tidal.orchestrator.task_config import (
    AgentTaskConfig,
    GeneratedCommon,
    ImportTaskConfig,
    TaskConfig,
    VerifiersTaskConfig,
)
from tidal.orchestrator.tasks.agent import AgentTask
from tidal.orchestrator.tasks.arithmetic import ArithmeticTask
from tidal.orchestrator.tasks.base import GeneratedTask, Task
from tidal.orchestrator.tasks.code import CodeTask
from tidal.orchestrator.tasks.countdown import CountdownTask
from tidal.orchestrator.tasks.dataset import DatasetTask
from tidal.orchestrator.tasks.lookup import LookupTask
from tidal.orchestrator.tasks.reasoning_gym import ReasoningGymTask
from tidal.orchestrator.tasks.reversal import ReversalTask

BUILT_IN = {
    "reversal": ReversalTask,
    "lookup": LookupTask,
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "dataset": DatasetTask,
    "reasoning_gym": ReasoningGymTask,
    "code": CodeTask,
}
VALID = (
    f"built-in types {sorted(BUILT_IN)}, "
    'type = "verifiers" with env = "<taskset id>", '
    'type = "agent" with command or url and [problems], '
    'or type = "import" with path = "pkg.module:Class"'
)


def import_task_class(path: str) -> type[Task]:
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"orchestrator task path {path!r}: cannot import: {exc}; {VALID}"
        ) from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(
            f"orchestrator task path {path!r}: {class_name!r} in {module_name} is not a "
            f"tidal.orchestrator.tasks.Task subclass; {VALID}"
        )
    return cls


def build_task(config: TaskConfig, *, seed: int = 0) -> Task:
    """The task a config names, bound to its metrics label and the run seed."""
    task: Task
    if isinstance(config, ImportTaskConfig):
        cls = import_task_class(config.path)
        try:
            task = cls(**config.options)
        except TypeError as exc:
            raise ConfigError(f"orchestrator task {config.path}: options: {exc}") from exc
    elif isinstance(config, VerifiersTaskConfig):
        from tidal.orchestrator.rollouts.verifiers_env import VerifiersTask  # optional extra

        task = VerifiersTask(config)
    elif isinstance(config, AgentTaskConfig):
        task = AgentTask(config, build_task(config.problems, seed=seed))
    elif config.type in BUILT_IN:  # each built-in class takes its own config type
        task = BUILT_IN[config.type](config)  # type: ignore[arg-type]
        if isinstance(task, GeneratedTask) and isinstance(config, GeneratedCommon):
            task.train_size = config.train_size
    else:  # unreachable through pydantic, which rejects unknown types with the choices
        raise ConfigError(f"orchestrator task type {getattr(config, 'type', None)!r}; {VALID}")
    default_name = task.name if task.name != Task.name else type(task).__name__
    task.bind(name=config.name or default_name, seed=seed)
    return task


def build_tasks(configs: Sequence[TaskConfig], *, seed: int) -> list[Task]:
    tasks = [build_task(c, seed=seed) for c in configs]
    names = [t.name for t in tasks]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(
            f"orchestrator tasks: names {duplicated} are used twice; give each task a `name`"
        )
    return tasks
