"""Dataset tasks over local files through `datasets`: formats, field mapping, splits, order."""

from __future__ import annotations

import json
import logging
import tomllib
from pathlib import Path
from typing import Any

import datasets
import pytest
from pydantic import ValidationError

from tidal.common.config.loading import to_toml
from tidal.common.errors import ConfigError
from tidal.orchestrator.task_config import DatasetTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.tasks.dataset import DatasetTask
from tidal.orchestrator.tasks.records import render_messages

ROWS = [{"question": f"q{i}", "solution": str(i), "level": i % 3} for i in range(12)]
QA = {"prompt_field": "question", "answer_field": "solution"}


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prompts(task: DatasetTask, split: str, count: int) -> list[str]:
    return [task.problem(i, split=split).prompt for i in range(count)]  # type: ignore[arg-type]


@pytest.mark.parametrize("form", ["parquet", "json", "arrow_file", "save_to_disk"])
def test_every_local_format_gives_the_same_records(tmp_path: Path, form: str) -> None:
    table = datasets.Dataset.from_list(ROWS)
    if form == "parquet":
        path = tmp_path / "qa.parquet"
        table.to_parquet(str(path))
    elif form == "json":
        path = tmp_path / "qa.json"
        table.to_json(str(path))  # JSON lines under a .json name
    elif form == "arrow_file":
        table.save_to_disk(str(tmp_path / "saved"))
        path = next((tmp_path / "saved").glob("*.arrow"))
    else:
        path = tmp_path / "saved"
        table.save_to_disk(str(path))
    task = DatasetTask(DatasetTaskConfig(path=path, eval_fraction=0, **QA))
    assert [(r.prompt, r.answer) for r in task.records] == [
        (r["question"], r["solution"]) for r in ROWS
    ]


def test_dataset_dict_folder_trains_on_split_and_evaluates_on_eval_split(tmp_path: Path) -> None:
    folder = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS[:8]),
            "test": datasets.Dataset.from_list(ROWS[8:]),
        }
    ).save_to_disk(str(folder))
    task = build_task(DatasetTaskConfig(path=folder, eval_split="test", **QA), seed=1)
    assert (task.size("train"), task.size("eval")) == (8, 4)
    assert _prompts(task, "eval", 4) == ["q8", "q9", "q10", "q11"]  # stored order
    assert set(_prompts(task, "train", 8)) == {f"q{i}" for i in range(8)}


def test_folder_of_data_files_takes_splits_from_file_names(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", ROWS[:10])
    _jsonl(folder / "test.jsonl", ROWS[10:])
    task = build_task(DatasetTaskConfig(path=folder, split="train", eval_split="test", **QA))
    assert (task.size("train"), task.size("eval")) == (10, 2)


def test_unknown_split_names_the_splits_there_are(tmp_path: Path) -> None:
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(folder))
    with pytest.raises(ConfigError, match=r"no split 'validation' \(splits: \['train'\]\)"):
        DatasetTask(DatasetTaskConfig(path=folder, split="validation", **QA))


def test_separate_eval_file_replaces_the_held_out_fraction(tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "train.jsonl", ROWS[:9])
    held = _jsonl(tmp_path / "eval.jsonl", ROWS[9:])
    task = build_task(DatasetTaskConfig(path=train, eval_path=held, **QA), seed=0)
    assert (task.size("train"), task.size("eval")) == (9, 3)
    assert _prompts(task, "eval", 3) == ["q9", "q10", "q11"]


def test_eval_fraction_and_an_eval_file_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="eval_fraction cannot be combined"):
        DatasetTaskConfig(
            path=tmp_path / "a.jsonl", eval_path=tmp_path / "b.jsonl", eval_fraction=0.2
        )


def test_a_config_with_an_eval_file_survives_the_resolved_config_round_trip(
    tmp_path: Path,
) -> None:
    # the launcher writes the resolved config and every service reads it back
    config = DatasetTaskConfig(path=tmp_path / "a.jsonl", eval_path=tmp_path / "b.jsonl")
    again = DatasetTaskConfig.model_validate(tomllib.loads(to_toml(config)))
    assert again == config and again.held_out_fraction == 0.0
    assert DatasetTaskConfig(path=tmp_path / "a.jsonl").held_out_fraction == 0.1


def test_a_field_no_record_has_names_the_field_the_file_and_the_fields(tmp_path: Path) -> None:
    path = tmp_path / "qa.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    with pytest.raises(ConfigError) as info:
        DatasetTask(DatasetTaskConfig(path=path, prompt_field="query", answer_field="solution"))
    message = str(info.value)
    assert "no field 'query'" in message and str(path) in message
    assert "fields: question, solution, level" in message


def test_a_record_missing_a_field_is_skipped_with_its_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", [*ROWS[:3], {"question": "q", "other": 1}])
    with caplog.at_level(logging.WARNING):
        task = DatasetTask(DatasetTaskConfig(path=path, eval_fraction=0, **QA))
    assert task.skipped_records == 1
    assert f"{path}:4: skipped: 'solution' must be a string or a number" in caplog.text
    assert "(fields: other, question)" in caplog.text


def test_metadata_fields_reach_the_problem(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", ROWS)
    task = DatasetTask(
        DatasetTaskConfig(path=path, eval_fraction=0, metadata_fields=["level"], **QA)
    )
    problem = task.problem(0)
    assert problem.metadata == {"level": int(problem.answer) % 3}


def test_chat_messages_are_kept_and_rendered_as_plain_prompt_text(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": chat, "answer": "4"}])
    task = DatasetTask(DatasetTaskConfig(path=path, messages_field="messages", eval_fraction=0))
    problem = task.problem(0)
    assert problem.messages == tuple(chat)
    assert problem.prompt == "system: Be brief.\nuser: 2+2?\nassistant: "
    assert problem.prompt == render_messages(chat)


def test_malformed_messages_are_skipped_naming_the_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}], "answer": "x"}
    bad = {"messages": [{"role": "robot", "content": "hi"}], "answer": "x"}
    path = _jsonl(tmp_path / "chat.jsonl", [good, bad])
    with caplog.at_level(logging.WARNING):
        task = DatasetTask(DatasetTaskConfig(path=path, messages_field="messages", eval_fraction=0))
    assert task.skipped_records == 1
    assert "'messages'[0] needs a role in" in caplog.text


def test_problem_i_is_the_same_for_a_rebuilt_task_and_epochs_are_reshuffled(
    tmp_path: Path,
) -> None:
    path = tmp_path / "qa.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    config = DatasetTaskConfig(path=path, eval_fraction=0.25, **QA)
    first, resumed = build_task(config, seed=7), build_task(config, seed=7)
    assert [first.problem(i).uid for i in range(30)] == [resumed.problem(i).uid for i in range(30)]
    epoch0, epoch1 = _prompts(first, "train", 9), [first.problem(9 + i).prompt for i in range(9)]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    assert not set(epoch0) & set(_prompts(first, "eval", 3))


def test_unknown_file_format_lists_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "qa.csv"
    path.write_text("question,solution\n")
    with pytest.raises(ConfigError, match=r"unknown format '\.csv'; use \.jsonl, \.json"):
        DatasetTask(DatasetTaskConfig(path=path, **QA))


@pytest.mark.parametrize("make", ["corrupt_parquet", "empty_folder"])
def test_an_unreadable_source_fails_at_start_naming_it(tmp_path: Path, make: str) -> None:
    if make == "corrupt_parquet":
        path = tmp_path / "qa.parquet"
        path.write_bytes(b"not parquet at all")
    else:
        path = tmp_path / "empty"
        path.mkdir()
    with pytest.raises(ConfigError, match=f"orchestrator task {path}: cannot read"):
        DatasetTask(DatasetTaskConfig(path=path, **QA))
