"""`tidal rl --resume` continues a run whose trainer was SIGKILLed mid-run.

The first life is the launcher with checkpoints every step and no restarts allowed
(`supervision.max_restarts = 0`); killing its trainer fails the run (exit 1, the budget is
spent). The second life is `tidal rl @ <run dir>/config.toml
--resume`: it keeps the run folder, the trainer restores its newest checkpoint, the
orchestrator continues from `progress.json`, and the run finishes every step, each
trained once (no step id refused, no "newer than the checkpoint").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_steps

STEPS, WARMUP = 8, 2
KILL_AT_STEP = 4


def _steps_logged(run_dir: Path) -> list[int]:
    return run_log_steps(run_dir / "metrics.jsonl")


@pytest.mark.slow
def test_rl_resume_finishes_a_run_whose_trainer_was_killed(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--orchestrator.steps", str(STEPS),
        "--orchestrator.warmup-steps", str(WARMUP),
        "--orchestrator.report.table-every", "0",
        "--trainer.ckpt.interval", "1",
        "--grpc.shutdown-grace-s", "0.5",
        "--supervision.max-restarts", "0",
    )  # fmt: skip
    run.wait_for_config()
    deadline = time.monotonic() + 240
    while max(_steps_logged(run.run_dir), default=0) < KILL_AT_STEP:
        assert run.process.poll() is None and time.monotonic() < deadline, run.output()
        time.sleep(0.2)
    cmdlines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in run.children()}
    (trainer,) = [pid for pid, cmdline in cmdlines.items() if b"tidal.trainer" in cmdline]
    os.kill(trainer, signal.SIGKILL)
    assert run.process.wait(timeout=60) == 1
    assert "trainer killed by signal SIGKILL" in run.output()
    checkpoints = sorted((run.run_dir / "checkpoints").glob("step_*"))
    assert checkpoints, "the first life wrote no checkpoint"

    config = str(run.run_dir / "config.toml")
    again = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "rl", "@", config, "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "run finished" in again.stdout
    steps = _steps_logged(run.run_dir)
    # One line per step: nothing skipped, nothing twice (a step trained but never
    # logged before the kill gets its "lost" line on resume).
    assert sorted(steps) == list(range(1, WARMUP + STEPS + 1))
    trainer_log = (run.run_dir / "logs" / "trainer.log").read_text()
    assert "resumed from" in trainer_log
    assert "newer than the checkpoint" not in trainer_log
    assert "already trained with other data" not in again.stdout
