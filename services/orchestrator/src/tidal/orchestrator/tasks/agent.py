"""An agent program as a task (`type = "agent"`): another task's problems, played by the agent.

The problems, the verifier and the warm-up demonstrations are those of the task named in
`problems`; only how an episode runs differs (rollouts/agent_episodes.py). The agent's
command is resolved at build time, so a program that is not there fails the run's start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tidal.common.errors import ConfigError
from tidal.orchestrator.task_config import AgentTaskConfig
from tidal.orchestrator.tasks.base import Problem, Split, Task, Verdict


def resolve_command(command: list[str]) -> list[str]:
    """`command` with its program as an absolute path (looked up on PATH); ConfigError."""
    program = command[0]
    found = program if Path(program).is_absolute() else shutil.which(program)
    if found is None or not Path(found).is_file():
        raise ConfigError(f"orchestrator task command: {program!r} is not a program")
    return [str(Path(found).absolute()), *command[1:]]


class AgentTask(Task):
    name = "agent"

    def __init__(self, config: AgentTaskConfig, problems: Task) -> None:
        self.config = config
        self.source = problems
        self.command = resolve_command(config.command) if config.command else []

    def bind(self, *, name: str, seed: int) -> None:
        super().bind(name=name, seed=seed)
        self.source.bind(name=name, seed=seed)  # its problems carry this task's name

    def problem(self, index: int, *, split: Split = "train") -> Problem:
        return self.source.problem(index, split=split)

    def size(self, split: Split = "train") -> int | None:
        return self.source.size(split)

    def verify(self, problem: Problem, completion: str) -> Verdict | float:
        return self.source.verify(problem, completion)

    def verify_turns(self, problem: Problem, turns: list[str]) -> Verdict | float:
        """The agent's final output (its only "turn") by the problems' verifier."""
        return self.source.verify(problem, turns[-1] if turns else "")

    @property
    def max_completion_chars(self) -> int:
        return self.source.max_completion_chars
