"""A programming task: problems with unit tests from local records, scored in the sandbox.

Records are read as by the dataset task (same files, splits and order); the tests and the
optional setup and entry point travel as the problem's metadata. `verify` runs the
completion's program in one sandboxed process and its tests here, calling into it
(code_harness.py), and returns the fraction passed, so a program that hangs, crashes or
attacks the host scores what it passed before, and none can forge a pass.
With `python_tool` the policy may also run code in the same sandbox before it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from functools import partial
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.sandbox import Sandbox, SandboxResult
from tidal.orchestrator.task_config import CodeTaskConfig, DatasetTaskConfig
from tidal.orchestrator.tasks.base import Problem, Split, Task, Tool, Verdict
from tidal.orchestrator.tasks.code_harness import HARNESS, Channel, extract_program, run_tests
from tidal.orchestrator.tasks.dataset import DatasetTask

CODE_SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "string"}},
    "required": ["code"],
    "additionalProperties": False,
}


def tool_result(result: SandboxResult) -> str:
    """What the policy reads back from a run: its output, and why it stopped if not cleanly."""
    text = result.stdout
    if result.stderr:
        text += ("\n" if text else "") + result.stderr
    if result.killed_reason is not None:
        text += f"\n[killed: {result.killed_reason} limit]"
    elif result.exit_code:
        text += f"\n[exit code {result.exit_code}]"
    return text


class CodeTask(Task):
    name = "code"

    def __init__(self, config: CodeTaskConfig) -> None:
        self.config = config
        extra = [f for f in (config.setup_field, config.entry_point_field) if f is not None]
        self.records = DatasetTask(
            DatasetTaskConfig(
                path=config.path,
                prompt_field=config.prompt_field,
                answer_field=config.reference_field,
                reference_field=config.reference_field,
                metadata_fields=[config.tests_field, *extra],
                eval_fraction=config.eval_fraction,
                max_answer_chars=config.max_answer_chars,
            )
        )
        for record in self.records.records:
            self._tests(record.metadata, f"{config.path}:{record.line}")
        self.sandbox = Sandbox(config.sandbox)
        if config.python_tool:
            self.tools = (
                Tool("python", "run Python code; returns its output", CODE_SCHEMA, self._python),
            )
        self.bind(name=self.name, seed=0)

    async def _python(self, problem: Problem, code: str) -> str:
        """The `python` tool: the policy's code, run in the task's sandbox."""
        return tool_result(await self.sandbox.run(code))

    def bind(self, *, name: str, seed: int) -> None:
        super().bind(name=name, seed=seed)
        self.records.bind(name=name, seed=seed)

    def size(self, split: Split = "train") -> int:
        return self.records.size(split)

    def problem(self, index: int, *, split: Split = "train") -> Problem:
        problem = self.records.problem(index, split=split)
        return replace(problem, tools=tuple(t.schema() for t in self.tools))

    def _tests(self, metadata: dict[str, Any], where: str) -> list[str]:
        raw = metadata[self.config.tests_field]
        if isinstance(raw, str):
            entry = self.config.entry_point_field
            return [f"{raw}\ncheck({metadata[entry]})" if entry else raw]
        if isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
            return list(raw)
        raise ConfigError(
            f"orchestrator task {where}: {self.config.tests_field!r} must be a string or a "
            "non-empty list of strings"
        )

    def verify(self, problem: Problem, completion: str) -> Verdict:
        tests = self._tests(problem.metadata, problem.uid)
        program = extract_program(completion)
        if self.config.entry_point_field:
            program = problem.prompt + program
        setup = problem.metadata.get(self.config.setup_field or "", "") or ""
        passed: set[int] = set()
        converse = partial(self._converse, setup=setup, tests=tests, passed=passed)
        files = {"solution.py": program, "setup.py": setup}
        result = asyncio.run(self.sandbox.run(HARNESS, files=files, converse=converse))
        return Verdict(
            len(passed) / len(tests),
            {"all_passed": float(len(passed) == len(tests)), "timed_out": float(result.timed_out)},
        )

    async def _converse(
        self,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
        *,
        setup: str,
        tests: list[str],
        passed: set[int],
    ) -> None:
        """Run the tests here against the sandboxed program's names (code_harness.py)."""
        try:
            kind, names = json.loads(await reader.readline())
        except (ValueError, TypeError):
            return  # it ended, or wrote something else, before it was ready: nothing passes
        if kind != "ready" or not isinstance(names, dict):
            return
        loop = asyncio.get_running_loop()
        channel = Channel(loop, writer, reader, timeout_s=self.sandbox.limits.wall_s)
        with contextlib.suppress(Exception):  # malformed names: what passed so far stands
            await asyncio.to_thread(run_tests, names, channel.call, setup, tests, passed)

    @property
    def max_completion_chars(self) -> int:
        return self.config.max_answer_chars
