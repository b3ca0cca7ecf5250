"""Built-in tasks, the JSONL/parquet dataset loader and plug-in tasks by import path."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from tidal.common.errors import ConfigError
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.task_config import (
    ArithmeticTaskConfig,
    CountdownTaskConfig,
    DatasetTaskConfig,
    ImportTaskConfig,
)
from tidal.orchestrator.tasks import GeneratedTask, Problem, Verdict, build_task, build_tasks
from tidal.orchestrator.tasks.countdown import check_countdown, evaluate_expression
from tidal.orchestrator.tasks.dataset import DatasetTask


class EchoTask(GeneratedTask):
    """A plug-in task for the import-path test: answer the prompt back."""

    def __init__(self, word: str = "hi") -> None:
        self.word = word

    def sample(self, rng: random.Random) -> Problem:
        return Problem(prompt=f"{self.word}{rng.randint(0, 9)}", reference=self.word)

    def verify(self, problem: Problem, completion: str) -> float:
        return float(completion == problem.reference)

    @property
    def max_completion_chars(self) -> int:
        return len(self.word)


def test_arithmetic_problems_are_correct_and_verified_numerically() -> None:
    task = build_task(ArithmeticTaskConfig(max_operand=9, operators="+-*"), seed=1)
    for i in range(50):
        problem = task.problem(i)
        a, op, b = problem.prompt[0], problem.prompt[1], problem.prompt[2:-1]
        assert problem.reference == str(eval(f"{a}{op}{b}"))  # safe: digits and one op
        assert task.verify(problem, f" {problem.reference}.0 ") == Verdict(1.0, {"is_number": 1.0})
        assert task.verify(problem, "x").reward == 0.0
    assert task.max_completion_chars == 2  # 81 and -9


def test_countdown_reference_reaches_the_target() -> None:
    task = build_task(CountdownTaskConfig(num_numbers=4, max_number=9), seed=0)
    for i in range(50):
        problem = task.problem(i)
        assert task.verify(problem, problem.reference).reward == 1.0


def test_countdown_checker_is_exact() -> None:
    assert check_countdown("3*5+7", [3, 5, 7], 22).reward == 1.0
    assert check_countdown("(7+5)/3*3", [3, 3, 5, 7], 12).reward == 1.0
    assert check_countdown("3*5+6", [3, 5, 7], 21).scores == {
        "valid_expression": 1.0,
        "uses_given_numbers": 0.0,
    }
    assert check_countdown("7+7+8", [7, 8, 9], 22).reward == 0.0  # 7 used twice
    assert check_countdown("3*5+7", [3, 5, 7], 23).reward == 0.0


@pytest.mark.parametrize("bad", ["__import__('os')", "2**99999", "1/0", "3+", "x", "9" * 300])
def test_countdown_rejects_anything_but_arithmetic(bad: str) -> None:
    assert check_countdown(bad, [1, 2, 3], 6).scores["valid_expression"] == 0.0


def test_evaluate_expression_uses_exact_fractions() -> None:
    value, used = evaluate_expression("1/3+1/3+1/3")
    assert value == 1 and used == [1, 3, 1, 3, 1, 3]


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_dataset_lines_are_skipped_counted_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write_jsonl(
        tmp_path / "qa.jsonl",
        [
            json.dumps({"prompt": "1+1=", "answer": 2}),
            "{not json",
            json.dumps({"prompt": "2+2="}),
            json.dumps(["a list"]),
            "",
            json.dumps({"prompt": "3+3=", "answer": "6"}),
        ],
    )
    with caplog.at_level(logging.WARNING):
        task = DatasetTask(DatasetTaskConfig(path=path, verifier="numeric", eval_fraction=0))
    assert task.skipped_records == 3
    assert len(task.records) == 2
    messages = caplog.text
    assert f"{path}:2: skipped: not valid JSON" in messages
    assert f"{path}:3: skipped: 'answer' must be a string or a number" in messages
    assert f"{path}:4: skipped: expected a JSON object" in messages


def test_dataset_with_no_usable_record_fails_with_the_file_name(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", ["nope"])
    with pytest.raises(ConfigError, match=r"bad\.jsonl: no usable records"):
        DatasetTask(DatasetTaskConfig(path=path))


def test_regex_dataset_skips_invalid_patterns(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "re.jsonl",
        [json.dumps({"prompt": "p", "answer": "a+"}), json.dumps({"prompt": "q", "answer": "("})],
    )
    task = DatasetTask(DatasetTaskConfig(path=path, verifier="regex", eval_fraction=0))
    assert task.skipped_records == 1
    problem = task.problem(0)
    assert task.verify(problem, "aaa").reward == 1.0
    assert task.verify(problem, "aab").reward == 0.0


def test_dataset_epochs_visit_every_train_record_once_and_hold_out_eval(tmp_path: Path) -> None:
    records = [json.dumps({"prompt": f"q{i}", "answer": str(i)}) for i in range(20)]
    path = _write_jsonl(tmp_path / "qa.jsonl", records)
    task = build_task(DatasetTaskConfig(path=path, eval_fraction=0.25), seed=3)
    assert (task.size("train"), task.size("eval")) == (15, 5)
    eval_prompts = {task.problem(i, split="eval").prompt for i in range(5)}
    for epoch in range(2):
        seen = [task.problem(epoch * 15 + i).prompt for i in range(15)]
        assert len(set(seen)) == 15 and not set(seen) & eval_prompts
    assert [task.problem(i).prompt for i in range(15)] != [
        task.problem(15 + i).prompt for i in range(15)
    ]  # each epoch is reshuffled


def test_dataset_extract_pattern_pulls_the_answer(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "qa.jsonl", [json.dumps({"prompt": "p", "answer": "1000"})])
    task = DatasetTask(
        DatasetTaskConfig(path=path, verifier="numeric", extract=r"= *(\S+)", eval_fraction=0)
    )
    assert task.verify(task.problem(0), "so x = 1,000").reward == 1.0
    assert task.verify(task.problem(0), "1000").scores == {"extracted": 0.0}


def test_parquet_dataset_loads_rows(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"]}), path)
    task = DatasetTask(DatasetTaskConfig(path=path, eval_fraction=0))
    assert sorted(r.prompt for r in task.records) == ["a", "b"]


def test_plugin_task_is_built_from_its_import_path() -> None:
    config = ImportTaskConfig(path=f"{__name__}:EchoTask", options={"word": "yo"})
    task = build_task(config, seed=0)
    problem = task.problem(4)
    assert problem.prompt.startswith("yo") and problem.uid == "EchoTask/train/4"
    assert problem == task.problem(4)  # deterministic by index
    assert task.verify(problem, "yo") == 1.0


def test_unknown_import_path_fails_with_the_valid_choices() -> None:
    with pytest.raises(ConfigError, match=r"cannot import.*built-in types \['arithmetic'"):
        build_task(ImportTaskConfig(path="no_such_module_xyz:Task"))
    with pytest.raises(ConfigError, match=r"is not a tidal\.orchestrator\.tasks\.Task subclass"):
        build_task(ImportTaskConfig(path="json:dumps"))


def test_unknown_task_type_and_algorithm_fail_with_the_valid_choices() -> None:
    with pytest.raises(ValidationError, match="'reversal', 'arithmetic', 'countdown'"):
        OrchestratorConfig.model_validate({"task": {"type": "chess"}})
    with pytest.raises(ValidationError, match="'grpo', 'dr_grpo', 'rloo' or 'remax'"):
        OrchestratorConfig(advantages={"algorithm": "ppo"})  # type: ignore[arg-type]


def test_a_task_mixture_replaces_the_single_task() -> None:
    config = OrchestratorConfig.model_validate(
        {"task": {"type": "reversal"}, "tasks": [{"type": "arithmetic", "weight": 2}]}
    )
    assert [(t.type, t.weight) for t in config.task_list] == [("arithmetic", 2.0)]
    assert [t.type for t in OrchestratorConfig().task_list] == ["reversal"]


def test_two_tasks_with_one_name_are_rejected() -> None:
    with pytest.raises(ConfigError, match="used twice"):
        build_tasks([ArithmeticTaskConfig(), ArithmeticTaskConfig()], seed=0)
