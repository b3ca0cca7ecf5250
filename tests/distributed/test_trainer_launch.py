"""`tidal rl` with `--trainer.world-size 2`: the trainer starts torchrun itself, rank 0
serves gRPC and leads rank 1, the orchestrator packs for the two data-parallel ranks the
trainer reports (nothing restates them), the run trains to the end and shuts down
cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_records

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
STEPS, WARMUP = 4, 2


def test_rl_run_with_a_two_rank_trainer_trains_every_step_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    command = [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
        "--run.output-dir", str(tmp_path), "--run.name", "ws2",
        "--trainer.world-size", "2",
        "--orchestrator.steps", str(STEPS), "--orchestrator.warmup-steps", str(WARMUP),
    ]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log = (tmp_path / "ws2" / "logs" / "trainer.log").read_text()
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{log[-3000:]}"
    assert "rank 1 of 2 follows rank 0" in log
    orchestrator_log = (tmp_path / "ws2" / "logs" / "orchestrator.log").read_text()
    assert "packing for 2 trainer data-parallel rank(s)" in orchestrator_log
    for step in range(1, STEPS + WARMUP + 1):
        assert f"trained step {step} " in log
    assert "Connection reset" not in log, log[-3000:]  # followers left on rank 0's stop
    metrics = run_log_records(tmp_path / "ws2" / "metrics.jsonl")
    assert [m["policy_version"] for m in metrics][-1] >= STEPS
