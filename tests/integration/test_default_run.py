"""The README's `make run`: the embedded default trains to completion and shows learning.

Also drives `tidal client` (the people's client) against a running stack, since both are
what a newcomer types first, and scrapes every service's Prometheus endpoint there (the
addresses `tidal rl` lists in prometheus_targets.json), and checks that everything the
run wrote is its user's only.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_records

from ..metrics_scrape import scrape

LEARNING_BAR = 0.3
WINDOW = 5


@pytest.mark.slow
def test_default_run_finishes_in_time_and_reward_rises(launch) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    run = launch()
    assert run.process.wait(timeout=300) == 0, run.output()
    assert time.monotonic() - started < 300
    out = run.output()
    assert "Tidal run summary" in out
    # The launcher prints the table once every service exited, with the two timing rows
    # (tidal.cli.run_timing), and keeps them in summary.json.
    assert "start-up to first step (s)" in out and "shutdown, last step to exit (s)" in out
    summary = json.loads((run.run_dir / "summary.json").read_text())
    launched, first, last = (
        summary[k] for k in ("launched_at", "first_step_started_at", "last_step_ended_at")
    )
    assert launched < first < last
    assert summary["startup_s"] == pytest.approx(first - launched)
    assert 0 < summary["shutdown_s"] < 60

    metrics = run_log_records(run.run_dir / "metrics.jsonl")
    for record in metrics:
        assert {"step", "reward_mean", "policy_version", "tokens_per_s"} <= record.keys()
    rl = [m["reward_mean"] for m in metrics if m["phase"] == "rl"]
    assert len(rl) >= 2 * WINDOW
    first, last = sum(rl[:WINDOW]) / WINDOW, sum(rl[-WINDOW:]) / WINDOW
    assert last - first >= LEARNING_BAR, f"reward {first:.3f} -> {last:.3f}"

    for name in ("reward.png", "traces.jsonl", "config.toml"):
        assert (run.run_dir / name).stat().st_size > 0, name
    assert (run.run_dir / "reward.png").read_bytes().startswith(b"\x89PNG")
    for service in ("orchestrator", "inference", "trainer", "weightsync"):
        assert (run.run_dir / "logs" / f"{service}.log").stat().st_size > 0


def _client(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", "client", *args, "@", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def _check_prometheus(run_dir: Path, steps: int) -> None:
    """Every service's /metrics, scraped while the stack runs after `steps` RL steps."""
    targets = json.loads((run_dir / "prometheus_targets.json").read_text())
    by_service = {t["labels"]["service"]: t["targets"][0] for t in targets}
    assert sorted(by_service) == ["inference", "orchestrator", "trainer", "weightsync"]
    scraped = {
        service: scrape(f"http://{address}/metrics") for service, address in by_service.items()
    }
    for service, m in scraped.items():
        assert m[f'tidal_service_info{{service="{service}"}}'] == 1
        assert m["tidal_restarts_total"] == 0
        assert m["process_resident_memory_bytes"] > 0

    trainer = scraped["trainer"]
    assert trainer["tidal_trainer_steps_total"] == steps
    assert trainer["tidal_trainer_last_step"] == steps
    assert trainer["tidal_trainer_step_seconds_count"] == steps
    assert trainer["tidal_trainer_step_seconds_sum"] > 0
    assert trainer["tidal_trainer_trained_tokens_total"] > 0
    assert trainer["tidal_trainer_publish_seconds_count"] == steps  # one version per step

    inference = scraped["inference"]
    assert inference["tidal_inference_generated_tokens_total"] > 0
    assert inference["tidal_inference_kv_blocks_capacity"] > 0
    assert inference["tidal_inference_kv_blocks_used"] >= 0
    assert (
        inference["tidal_inference_kv_blocks_used"]
        <= inference["tidal_inference_kv_blocks_capacity"]
    )
    assert inference["tidal_inference_kv_slots_used"] >= 0
    assert (
        inference["tidal_inference_kv_slots_used"] <= inference["tidal_inference_kv_slots_capacity"]
    )
    assert 0 <= inference["tidal_inference_kv_usage_ratio"] <= 1
    kv_bytes = inference["tidal_inference_kv_cache_bytes_capacity"]
    assert kv_bytes > 0
    assert 0 <= inference["tidal_inference_kv_cache_bytes_used"] <= kv_bytes
    assert inference["tidal_inference_requests_waiting"] >= 0
    assert 0 <= inference["tidal_inference_policy_version"] <= steps
    assert inference['tidal_inference_weight_load_seconds_count{path="filesystem"}'] >= 1

    orchestrator = scraped["orchestrator"]
    assert orchestrator['tidal_orchestrator_steps_total{phase="rl"}'] == steps
    assert orchestrator['tidal_orchestrator_step_seconds_count{phase="rl"}'] == steps
    assert orchestrator["tidal_orchestrator_generated_tokens_total"] > 0
    assert (
        orchestrator["tidal_orchestrator_trained_tokens_total"]
        == trainer["tidal_trainer_trained_tokens_total"]
    )
    assert orchestrator["tidal_orchestrator_sample_staleness_count"] > 0
    assert orchestrator["tidal_orchestrator_sample_staleness_sum"] >= 0
    assert orchestrator["tidal_orchestrator_generate_inflight"] >= 0

    weightsync = scraped["weightsync"]
    assert weightsync["tidal_weightsync_newest_version"] == steps
    assert weightsync["tidal_weightsync_versions_published_total"] == steps + 1
    assert weightsync["tidal_weightsync_replicas"] >= 1


@pytest.mark.slow
def test_client_reports_status_versions_progress_and_generates(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--orchestrator.steps",
        "2",
        "--orchestrator.warmup-steps",
        "0",
        "--orchestrator.exit-when-done",
        "false",
    )
    run.wait_for_config()
    config = run.run_dir / "config.toml"
    deadline = time.monotonic() + 120
    while True:
        progress = _client("progress", config=config)
        if progress.returncode == 0 and progress.stdout.startswith("done"):
            break
        assert time.monotonic() < deadline and run.process.poll() is None, run.output()
        time.sleep(0.5)
    assert "step 2/2" in progress.stdout
    _check_prometheus(run.run_dir, steps=2)

    status = _client("status", config=config)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("SERVING") == 4 and "NOT_SERVING" not in status.stdout

    versions = _client("versions", config=config)
    assert versions.returncode == 0
    rows = [line.split("│")[1].strip() for line in versions.stdout.splitlines() if "│" in line]
    assert rows[:3] == ["0", "1", "2"]

    args = ("generate", "abc>", "--max-tokens", "6", "--n", "2", "--temperature", "1")
    first = _client(*args, "--seed", "7", config=config)
    again = _client(*args, "--seed", "7", config=config)
    assert first.returncode == 0 and first.stdout == again.stdout  # same seed, same tokens
    assert "[0]" in first.stdout and "[1]" in first.stdout and "versions [2]" in first.stdout

    empty = _client("generate", "", config=config)
    assert empty.returncode == 1 and "INVALID_ARGUMENT" in empty.stdout
    assert _client("status", config=config).returncode == 0  # still serving

    assert run.stop() == 130
    _check_private(run.run_dir)


def _check_private(run_dir: Path) -> None:
    """What a run writes is its user's only by default (run.shared_readable off): weights,
    checkpoints, logs, traces, credentials, whichever process or library made them."""
    paths = [run_dir, *run_dir.rglob("*")]
    assert any(p.is_file() and p.parent.name.startswith("v") for p in paths)  # a version
    wrong = {
        str(p.relative_to(run_dir)): oct(stat.S_IMODE(p.lstat().st_mode))
        for p in paths
        if stat.S_IMODE(p.lstat().st_mode) != (0o700 if p.is_dir() else 0o600)
    }
    assert not wrong, wrong
