"""An agent program as a task (`type = "agent"`): another task's problems, played by the agent.

The problems, the verifier and the warm-up demonstrations are those of the task named in
`problems`; only how an episode runs differs (rollouts/agent_episodes.py). The agent's
command and its `files` are resolved at build time, so a program or a file that is not there
fails the run's start.
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


def resolve_files(files: list[str]) -> list[str]:
    """`files` as absolute paths of things that exist; ConfigError naming one that does not."""
    resolved = []
    for name in files:
        path = Path(name).expanduser().absolute()
        if not path.exists():
            raise ConfigError(f"orchestrator task files: {name!r} does not exist")
        resolved.append(str(path))
    return resolved


class AgentTask(Task):
    name = "agent"

    def __init__(self, config: AgentTaskConfig, problems: Task) -> None:
        self.config = config
        self.source = problems
        self.command = resolve_command(config.command) if config.command else []
        # what the sandbox lends the agent read-only: its program and its `files`
        self.files = [*self.command[:1], *resolve_files(config.files)]

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
