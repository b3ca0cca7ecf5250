"""The saved progress: atomic replacement and where a restart continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.common.errors import ConfigError
from tidal.orchestrator.records.resume import (
    SavedProgress,
    load_progress,
    resume_point,
    save_progress,
)


def _saved(step: int) -> SavedProgress:
    return SavedProgress(step, {"c": step - 1}, {"c": step}, seed=0, tasks=["reversal"])


def test_progress_round_trips_and_replaces_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "run" / "progress.json"
    assert load_progress(path) is None
    save_progress(path, _saved(3))
    save_progress(path, _saved(4))
    assert load_progress(path) == _saved(4)
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]  # no temp file left


def test_trained_step_continues_after_it_from_the_after_state() -> None:
    assert resume_point(_saved(7), trainer_step=7) == (8, {"c": 7})


def test_step_that_never_reached_the_trainer_is_redone_from_the_before_state() -> None:
    assert resume_point(_saved(7), trainer_step=6) == (7, {"c": 6})


def test_a_trained_step_lost_before_it_was_durable_is_redone_from_the_state_before_it() -> None:
    """Train(6) answered, the trainer killed during step 7's update, before step 6's
    checkpoint was complete: it resumes at 5, and step 6 is drawn again."""
    saved = SavedProgress(7, {"c": 6}, {"c": 7}, seed=0, tasks=["t"], previous_before={"c": 5})
    assert resume_point(saved, trainer_step=5) == (6, {"c": 5})
    with pytest.raises(ConfigError, match="last step is 4 \\(expected 7 or 6 or 5\\)"):
        resume_point(saved, trainer_step=4)


def test_previous_before_chains_saves_across_a_resume() -> None:
    """Each save carries the state before the previous step, also for the first save after
    a resume (chained to the previous life's file), so a trainer two steps behind can be
    resumed again right away."""
    from tidal.orchestrator.records.resume import previous_before

    last = SavedProgress(7, {"c": 6}, {"c": 7}, seed=0, tasks=["t"], previous_before={"c": 5})
    assert previous_before(None, 1) is None  # a run's first step
    assert previous_before(last, 8) == {"c": 6}  # the next step: before step 7
    assert previous_before(last, 7) == {"c": 5}  # step 7 redone after a resume
    assert previous_before(last, 6) is None  # resumed two back: step 5's state is unknown
    nxt = SavedProgress(8, {"c": 7}, {"c": 8}, seed=0, tasks=["t"],
                        previous_before=previous_before(last, 8))  # fmt: skip
    assert resume_point(nxt, trainer_step=6) == (7, {"c": 6})


def test_the_metrics_lines_of_lost_steps_are_removed(tmp_path: Path) -> None:
    from tidal.orchestrator.records.resume import drop_lost_lines
    from tidal.orchestrator.records.run_log import run_log_steps

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"ste')
    assert drop_lost_lines(metrics, trainer_step=1) == [2, 3]
    assert run_log_steps(metrics) == [1]
    assert metrics.read_text() == '{"step": 1}\n'
    assert drop_lost_lines(metrics, trainer_step=1) == []
    assert drop_lost_lines(tmp_path / "none.jsonl", trainer_step=0) == []


def test_a_run_log_reads_back_as_records_without_its_torn_line(tmp_path: Path) -> None:
    from tidal.orchestrator.records.run_log import run_log_records

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "phase": "rl"}\n[2]\n{"step": 2}\n{"ste')
    assert run_log_records(metrics) == [{"step": 1, "phase": "rl"}, {"step": 2}]
    assert run_log_records(tmp_path / "none.jsonl") == []


def test_progress_and_trainer_out_of_step_is_an_error() -> None:
    with pytest.raises(ConfigError, match="written for step 7 but the trainer's last step is 3"):
        resume_point(_saved(7), trainer_step=3)


def test_a_foreign_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ConfigError, match="not a progress file"):
        load_progress(path)


def test_a_trained_step_whose_reply_was_lost_gets_its_saved_metrics_line(tmp_path: Path) -> None:
    from tidal.orchestrator.records.resume import recover_metrics_line
    from tidal.orchestrator.records.run_log import logged_steps

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"ste')  # killed while writing step 3's line
    saved = SavedProgress(3, {}, {}, seed=0, tasks=["t"], pending_metrics={"step": 3, "x": 1.0})
    assert not recover_metrics_line(saved, trainer_step=2, metrics_path=metrics)  # redone
    assert metrics.read_text() == '{"step": 1}\n{"step": 2}\n'  # the torn line is cut
    assert recover_metrics_line(saved, trainer_step=3, metrics_path=metrics)
    assert json.loads(metrics.read_text().splitlines()[-1]) == {
        "step": 3,
        "x": 1.0,
        "recovered": True,
    }
    assert not recover_metrics_line(saved, trainer_step=3, metrics_path=metrics)  # once
    assert logged_steps(metrics) == {1, 2, 3}


def test_a_trained_step_whose_answer_was_lost_still_gets_its_metrics_line(
    tmp_path: Path,
) -> None:
    """On --resume the step the trainer holds but the orchestrator never logged
    gets a line (phase "lost"), so metrics.jsonl keeps one line per step."""
    from tidal.orchestrator.records.run_log import RunLog, StepRecord

    path = tmp_path / "metrics.jsonl"
    RunLog(path, tensorboard=False).append(StepRecord.lost(1))
    with path.open("a") as f:
        f.write('{"step": 2, "pha')  # a line torn by the crash
    log = RunLog(path, tensorboard=False)  # the resumed orchestrator's
    assert log.logged_steps() == {1}
    log.append(StepRecord.lost(2))
    lines = [json.loads(x) for x in log.path.read_text().splitlines()[-1:]]
    assert lines[0]["step"] == 2 and lines[0]["resume/metrics_lost"] == 1
    assert lines[0]["phase"] == "lost"


def test_a_recovered_metrics_line_that_meets_a_full_disk_is_disk_full_naming_the_file(
    tmp_path: Path,
) -> None:
    """A plain append's ENOSPC would fail the orchestrator as a crash to restart; as
    `DiskFull` it stops the run once, exit 74, naming the file."""
    from tests.helpers.small_disk import fill, small_disk
    from tidal.common.errors import DiskFull
    from tidal.orchestrator.records.resume import recover_metrics_line

    with small_disk(tmp_path / "tiny", "64k") as tiny:
        metrics = tiny / "metrics.jsonl"
        metrics.write_text('{"step": 1}\n')
        pending = {"step": 2, "note": "x" * 8192}  # more than a page: the write needs a block
        saved = SavedProgress(2, {}, {}, seed=0, tasks=["t"], pending_metrics=pending)
        fill(tiny, 0)
        with pytest.raises(DiskFull, match=f"disk full: {metrics} could not be written"):
            recover_metrics_line(saved, trainer_step=2, metrics_path=metrics)
