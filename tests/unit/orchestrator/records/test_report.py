"""The end-of-run summary, report.png and the live table, from metrics records."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tidal.orchestrator.records.report import print_live_table, summarize, write_report
from tidal.orchestrator.records.run_log import RunLog, StepRecord


def _record(step: int, phase: str, reward: float | None, **extra: float) -> StepRecord:
    return StepRecord(
        step=step,
        phase=phase,
        reward_mean=reward,
        reward_std=0.1 if reward is not None else None,
        policy_version=step - 1,
        policy_version_max=step - 1,
        staleness_mean=1.0 if phase == "rl" else None,
        samples=8,
        dropped_stale=1 if phase == "rl" else 0,
        completion_len_mean=3.0,
        exact_fraction=reward,
        generated_tokens=10,
        trained_tokens=20,
        micro_batches=1,
        generate_seconds=0.1,
        train_seconds=0.2,
        seconds=0.5,
        tokens_per_s=60.0,
        trace_id="0" * 32,
        extra=dict(extra),
    )


def _records() -> list[StepRecord]:
    start = {"eval_start/reversal/greedy_accuracy": 0.0}  # eval.at_start, on the first line
    records = [_record(1, "warmup", None, **start), _record(2, "warmup", None)]
    for step in range(3, 15):
        extra = {"wait/trainer_s": 0.25, "wait/policy_s": 0.5, "dropped/zero_variance_groups": 2}
        if step % 4 == 0:
            extra["eval/reversal/greedy_accuracy"] = step / 20
        records.append(_record(step, "rl", step / 20, **extra))
    return records


def test_summary_windows_rewards_and_totals_the_waits() -> None:
    summary = summarize(_records(), total_seconds=10.0)
    assert (summary.warmup_steps, summary.rl_steps) == (2, 12)
    assert summary.first_reward == pytest.approx(sum(range(3, 8)) / 5 / 20)
    assert summary.last_reward == pytest.approx(sum(range(10, 15)) / 5 / 20)
    assert summary.trainer_wait_s == pytest.approx(12 * 0.25)
    assert summary.policy_wait_s == pytest.approx(12 * 0.5)
    assert summary.dropped == 12 * (1 + 2)
    assert summary.tokens_per_s == pytest.approx(14 * 30 / 10.0)


def test_report_png_is_written(tmp_path: Path) -> None:
    write_report(_records(), tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_plots_mismatch_staleness_and_corrections(tmp_path: Path) -> None:
    records = _records()
    for r in records[2:]:
        r.train.update(
            {"mismatch_kl": 0.0, "stale_kl/1": 0.01 * r.step, "clip_frac": 0.1},
            **{"correction/tis": 0.05, "staleness_share/0": 0.5},
        )
    write_report(records, tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_live_table_shows_recent_steps() -> None:
    out = io.StringIO()
    print_live_table(_records()[-3:], Console(file=out, width=200))
    text = out.getvalue()
    assert "recent steps" in text and " 14 " in text and "0.700" in text


def test_metrics_jsonl_flattens_extras_and_nulls_non_finite(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "metrics.jsonl", tensorboard=False)
    record = _record(3, "rl", float("nan"), **{"task/reversal/reward_mean": 0.5})
    log.append(record)
    line = (tmp_path / "metrics.jsonl").read_text()
    assert '"reward_mean": null' in line and '"task/reversal/reward_mean": 0.5' in line
