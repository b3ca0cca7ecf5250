"""The code task scores correct, wrong, partial and malicious programs by the tests they pass."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from tidal.orchestrator.completions import ToolStats
from tidal.orchestrator.config import ToolsConfig
from tidal.orchestrator.rollouts.tool_execution import ToolUse, run_calls
from tidal.orchestrator.scoring.sandbox import SandboxLimits
from tidal.orchestrator.task_config import CodeTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.tasks.base import Problem, Task
from tidal.orchestrator.tasks.code_harness import extract_program
from tidal.text.byte import ByteTokenizer
from tidal.text.tool_calls import ToolCall, tool_call_parser

from ...helpers.sandbox_walls import ROOMY_WALL_S

FIXTURES = Path(__file__).with_name("fixtures")


@pytest.fixture(scope="module")
def mbpp() -> Task:
    return build_task(
        CodeTaskConfig(
            path=FIXTURES / "code_problems.jsonl",
            setup_field="test_setup_code",
            sandbox={"wall_s": ROOMY_WALL_S},
        )
    )


def problem_for(task: Task, function: str) -> Problem:
    problems = [task.problem(i) for i in range(task.size())]
    return next(p for p in problems if f"def {function}(" in p.reference)


def test_the_reference_program_passes_every_test(mbpp: Task) -> None:
    for i in range(mbpp.size()):
        problem = mbpp.problem(i)
        verdict = mbpp.verify(problem, problem.reference)
        assert verdict.reward == 1.0, problem.prompt
        assert verdict.scores == {"all_passed": 1.0, "timed_out": 0.0}


def test_reward_is_the_fraction_of_tests_passed(mbpp: Task) -> None:
    add = problem_for(mbpp, "add")
    assert mbpp.verify(add, "def add(a, b):\n    return a - b\n").reward == 0.25  # only 0+0
    assert mbpp.verify(add, "def add(a, b):\n    return a * b + 7\n").reward == 0.0
    assert mbpp.verify(add, "this is not python").reward == 0.0


def test_setup_code_runs_before_the_tests(mbpp: Task) -> None:
    scale = problem_for(mbpp, "scale")
    assert mbpp.verify(scale, scale.reference).reward == 1.0


def test_a_fenced_block_is_the_program(mbpp: Task) -> None:
    add = problem_for(mbpp, "add")
    completion = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_program(completion) == "def add(a, b):\n    return a + b\n"
    assert mbpp.verify(add, completion).reward == 1.0


@pytest.mark.parametrize(
    "program",
    [
        "import os\nos._exit(0)",
        "import sys\nsys.exit(0)",
        "print('\\n'.join(f'x {i}' for i in range(10)))\nraise SystemExit(0)",
        "def add(a, b):\n    raise SystemExit(0)",
        "import sys\ntoken = sys.stdin.read().strip()\nprint(*(f'{token} {i}' for i in range(4)))",
    ],
    ids=["os-exit", "sys-exit", "fake-report", "exit-in-function", "stdin-nonce"],
)
def test_programs_that_cheat_pass_nothing(mbpp: Task, program: str) -> None:
    add = problem_for(mbpp, "add")
    assert mbpp.verify(add, program).reward == 0.0


def test_results_cross_with_their_exact_types(mbpp: Task) -> None:
    add = problem_for(mbpp, "add")
    tests = ["assert add((1,), (2,)) == (1, 2)", "assert add({1}, {2}) == 3"]
    typed = replace(add, metadata={**add.metadata, "test_list": tests})
    assert mbpp.verify(typed, "def add(a, b):\n    return a + b\n").reward == 0.5
    assert mbpp.verify(typed, "def add(a, b):\n    return list(a + b)\n").reward == 0.0


def test_a_builtin_exception_the_program_raises_reaches_the_tests(mbpp: Task) -> None:
    add = problem_for(mbpp, "add")
    tests = [
        "try:\n    add(1, -1)\n    raise AssertionError\nexcept ValueError:\n    pass",
        "assert add(1, 2) == 3",
    ]
    raising = replace(add, metadata={**add.metadata, "test_list": tests})
    program = "def add(a, b):\n    if b < 0:\n        raise ValueError(b)\n    return a + b\n"
    assert mbpp.verify(raising, program).reward == 1.0


def test_a_program_that_hangs_scores_what_it_passed_before() -> None:
    task = build_task(
        CodeTaskConfig(
            path=FIXTURES / "code_problems.jsonl", sandbox={"wall_s": ROOMY_WALL_S, "cpu_s": 1}
        )
    )  # the CPU limit ends the hang, however long a loaded machine takes to reach it
    even = problem_for(task, "is_even")
    program = "def is_even(n):\n    while n == 3:\n        pass\n    return n % 2 == 0\n"
    verdict = task.verify(even, program)
    assert verdict.reward == pytest.approx(
        1 / 3
    )  # the test of 3 hangs; the one after it never runs
    assert verdict.scores["all_passed"] == 0.0


def test_humaneval_records_complete_the_prompt() -> None:
    task = build_task(
        CodeTaskConfig(
            path=FIXTURES / "code_humaneval.jsonl",
            prompt_field="prompt",
            tests_field="test",
            reference_field="canonical_solution",
            entry_point_field="entry_point",
            eval_fraction=0.0,
            sandbox={"wall_s": ROOMY_WALL_S},
        )
    )
    problem = task.problem(0)
    assert task.verify(problem, "    return 2 * x\n").reward == 1.0
    assert task.verify(problem, "    return x + 1\n").reward == 0.0


def _with_python(wall_s: float) -> Task:
    return build_task(
        CodeTaskConfig(
            path=FIXTURES / "code_problems.jsonl",
            setup_field="test_setup_code",
            python_tool=True,
            sandbox=SandboxLimits(wall_s=wall_s, cpu_s=2),
        )
    )


@pytest.fixture(scope="module")
def mbpp_with_python() -> Task:
    """A short deadline, for the test of the deadline."""
    return _with_python(2.0)


@pytest.fixture(scope="module")
def roomy_python() -> Task:
    """A deadline no loaded machine's start reaches, for what the tool answers."""
    return _with_python(ROOMY_WALL_S)


def test_the_python_tool_is_offered_only_when_configured(
    mbpp: Task, mbpp_with_python: Task
) -> None:
    assert mbpp.problem(0).tools == ()
    (offered,) = mbpp_with_python.problem(0).tools
    assert offered["function"]["name"] == "python"
    assert offered["function"]["parameters"]["required"] == ["code"]


async def _run_python(task: Task, code: str, timeout_s: float = 10.0) -> tuple[str, ToolStats]:
    config = ToolsConfig(call_timeout_s=timeout_s)
    use = ToolUse.of(task.tools, tool_call_parser(ByteTokenizer()), config)
    (message,), stats = await run_calls([ToolCall("python", {"code": code})], use, task.problem(0))
    assert message["role"] == "tool" and message["name"] == "python"
    return message["content"], stats


async def test_the_python_tool_runs_the_policys_code_in_the_sandbox(roomy_python: Task) -> None:
    timeout_s = ROOMY_WALL_S + 30.0
    text, stats = await _run_python(roomy_python, "print(sum(range(10)))", timeout_s)
    assert text.strip() == "45"
    assert stats.calls == 1 and stats.errors == 0
    text, _ = await _run_python(roomy_python, "raise SystemExit(3)", timeout_s)
    assert text.endswith("[exit code 3]")
    text, _ = await _run_python(roomy_python, "import sys\nprint('x', file=sys.stderr)", timeout_s)
    assert text.strip() == "x"


async def test_a_hostile_tool_call_is_killed_at_the_wall_and_reported(
    mbpp_with_python: Task,
) -> None:
    started = time.monotonic()
    text, stats = await _run_python(mbpp_with_python, "while True:\n    pass")
    assert "[killed:" in text
    assert stats.errors == 0  # the tool answered: the policy reads why its code stopped
    assert time.monotonic() - started < 10
