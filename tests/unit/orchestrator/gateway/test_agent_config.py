"""An agent task's config is checked at start: exactly one of a program and a service, a
program and files that exist (the program looked up on PATH), and a judge on the agent's
output, not on the problems' task."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tidal.common.errors import ConfigError
from tidal.orchestrator.task_config import AgentTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.tasks.agent import AgentTask

PROBLEMS = {"type": "lookup"}


def test_a_command_is_resolved_on_path_and_problems_keep_the_agent_tasks_name() -> None:
    task = build_task(AgentTaskConfig(problems=PROBLEMS, command=["sh", "-c", "true"]), seed=0)
    assert isinstance(task, AgentTask)
    assert task.command[0].endswith("/sh") and task.command[1:] == ["-c", "true"]
    problem = task.problem(0)
    assert problem.task == task.name == "agent" and problem.tools


def test_a_program_that_is_not_there_fails_the_start() -> None:
    with pytest.raises(ConfigError, match="no-such-agent"):
        build_task(AgentTaskConfig(problems=PROBLEMS, command=["no-such-agent"]), seed=0)


def test_the_sandbox_lends_the_program_and_its_files_and_a_missing_file_fails_the_start(
    tmp_path: Path,
) -> None:
    script = tmp_path / "agent.py"
    script.write_text("print('hi')")
    config = AgentTaskConfig(problems=PROBLEMS, command=["sh", str(script)], files=[str(script)])
    task = build_task(config, seed=0)
    assert isinstance(task, AgentTask)
    assert task.files == [task.command[0], str(script)]
    missing = config.model_copy(update={"files": [str(tmp_path / "gone")]})
    with pytest.raises(ConfigError, match="gone"):
        build_task(missing, seed=0)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"command": ["sh"], "url": "http://127.0.0.1:1/"},
        {"url": "ftp://agents/"},
        {"command": ["sh"], "problems": {**PROBLEMS, "reward": {"type": "judge"}}},
    ],
    ids=["neither", "both", "not-http", "judge-on-problems"],
)
def test_inconsistent_agent_configs_are_refused(fields: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError):
        AgentTaskConfig(**{"problems": PROBLEMS, **fields})
