"""The saved progress: atomic replacement and where a restart continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.common.errors import ConfigError
from tidal.orchestrator.resume import (
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


def test_progress_and_trainer_out_of_step_is_an_error() -> None:
    with pytest.raises(ConfigError, match="written for step 7 but the trainer's last step is 3"):
        resume_point(_saved(7), trainer_step=3)


def test_a_foreign_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ConfigError, match="not a progress file"):
        load_progress(path)


def test_a_trained_step_whose_reply_was_lost_gets_its_saved_metrics_line(tmp_path: Path) -> None:
    from tidal.orchestrator.resume import logged_steps, recover_metrics_line

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
