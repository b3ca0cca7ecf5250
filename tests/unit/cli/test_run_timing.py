"""tidal rl's start-up and shutdown figures: the launch time, summary.json, the table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tidal.cli.run_timing import (
    finish_summary,
    launch_env,
    print_final_summary,
    process_start_time,
)
from tidal.orchestrator.records.report import RunSummary, write_summary
from tidal.orchestrator.training_run import launched_at_from_env

from ...helpers.small_disk import fill, small_disk


def test_process_start_time_is_this_process_start() -> None:
    started = process_start_time()
    assert 0 < time.time() - started < 3600  # the test process started before now


def test_the_launch_time_reaches_the_orchestrator_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    launched = process_start_time()
    for key, value in launch_env(launched).items():
        monkeypatch.setenv(key, value)
    assert launched_at_from_env() == launched


def test_finish_summary_adds_shutdown_and_the_table_shows_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = time.time() - 10
    summary = RunSummary(2, 0, 0.1, 0.5, 4.0, 100.0, startup_s=3.25)
    marks = {"launched_at": launched, "first_step_started_at": launched + 3.25}
    write_summary(summary, tmp_path / "summary.json", **marks, last_step_ended_at=time.time())

    assert finish_summary(tmp_path, launched + 1) is None  # another launch's file
    finished = finish_summary(tmp_path, launched)
    assert finished is not None
    assert 0 <= float(finished["shutdown_s"]) < 60  # type: ignore[arg-type]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["shutdown_s"] == finished["shutdown_s"] and saved["startup_s"] == 3.25

    print_final_summary(finished)
    out = capsys.readouterr().out
    assert "start-up to first step (s)" in out and "3.25" in out
    assert "shutdown, last step to exit (s)" in out


def test_no_summary_file_means_no_table(tmp_path: Path) -> None:
    assert finish_summary(tmp_path, time.time()) is None


def test_a_full_disk_keeps_the_summary_file_as_it_was_and_still_gives_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every step finished, then the disk filled: the launcher says summary.json could not
    be updated (one line naming the file) instead of failing the finished run."""
    with small_disk(tmp_path / "tiny", "64k") as tiny:
        launched = time.time() - 10
        summary = RunSummary(2, 0, 0.1, 0.5, 4.0, 100.0, startup_s=3.25)
        write_summary(
            summary, tiny / "summary.json", launched_at=launched, last_step_ended_at=time.time()
        )
        before = (tiny / "summary.json").read_text()
        fill(tiny, 0)
        finished = finish_summary(tiny, launched)
        assert finished is not None and "shutdown_s" in finished
        assert (tiny / "summary.json").read_text() == before
        assert [p.name for p in tiny.iterdir() if p.name.startswith(".")] == []
    err = capsys.readouterr().err
    assert "summary.json keeps its earlier contents: disk full:" in err
