"""A full disk stops `tidal rl` once, clearly; after space is freed `--resume` finishes.

The run folder is a small tmpfs (root mounts it, as in CI; skipped elsewhere). After a few
steps a filler file takes all but a little of it, so the next weight version cannot be
written. Asserted: the launcher exits 74 within a bounded time with one message naming
the path that could not be written and `--resume`, with no traceback in its output or
any service log and no restart; no temp folder of a failed write is left. Then the filler
is deleted and `tidal rl … --resume` finishes: every step id trained exactly once in the
surviving lineage, one metrics line per step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_steps

from ..helpers.small_disk import fill
from ..helpers.small_disk import small_disk as mounted_small_disk

TRAINED = re.compile(r"tidal\.trainer\.runner: (?:trained|replayed) step (\d+)\b")
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)")
STEPS, WARMUP = 20, 2
"""Steps enough that the run is still training when the filler is done (a step of the
default model takes a fraction of a second on an idle machine)."""
FILL_AFTER_STEP = 3
SLACK = 256 << 10
"""Bytes left free: less than one weight version of the default model, more than logs need."""
STOP_WITHIN_S = 120


def surviving_lineage(trainer_log: str) -> list[int]:
    """The steps of the lineage that survived, in training order: a life's resume keeps
    only the steps its checkpoint holds, then replays and trains the rest."""
    lineage: list[int] = []
    for line in trainer_log.splitlines():
        if m := RESUMED.search(line):
            lineage = [s for s in lineage if s <= int(m.group(1))]
        elif m := TRAINED.search(line):
            lineage.append(int(m.group(1)))
    return lineage


def tails(run) -> str:  # type: ignore[no-untyped-def]
    """The launcher's output and the end of every service log: the folder is a tmpfs that
    is gone once the test ends."""
    logs = sorted((run.run_dir / "logs").glob("*.log"))
    return run.output() + "".join(
        f"\n--- {log.name} ---\n{log.read_text(errors='replace')[-4000:]}" for log in logs
    )


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    with mounted_small_disk(tmp_path / "outputs", "64m") as outputs:  # the launch fixture's
        yield outputs


@pytest.mark.slow
def test_a_full_disk_stops_the_run_once_and_resume_finishes_it(  # type: ignore[no-untyped-def]
    launch, small_disk: Path, tmp_path: Path
) -> None:
    run = launch(
        "--orchestrator.steps", str(STEPS),
        "--orchestrator.warmup-steps", str(WARMUP),
        "--orchestrator.report.table-every", "0",
    )  # fmt: skip
    run.wait_for_config()
    metrics = run.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while max(run_log_steps(metrics), default=0) < FILL_AFTER_STEP:
        assert run.process.poll() is None and time.monotonic() < deadline, run.output()
        time.sleep(0.1)
    filler = fill(small_disk, SLACK)

    try:
        code = run.process.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"not stopped {STOP_WITHIN_S} s after the disk filled:\n{tails(run)}")
    output = run.output()
    assert code == 74, tails(run)
    assert "Traceback" not in output, output
    (stopped,) = [line for line in output.splitlines() if "run stopped after step" in line]
    assert "disk full: " + str(run.run_dir) in stopped and "could not be written" in stopped
    assert "MiB needed" in stopped and "--resume" in stopped
    assert "orchestrator exited with code 74; the disk is full" in output
    assert "restarting it" not in output
    for log in (run.run_dir / "logs").glob("*.log"):
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, f"{log.name}:\n{text[-6000:]}"
    for folder in ("weights", "checkpoints", "checkpoints/journal"):
        temps = [p.name for p in (run.run_dir / folder).glob(".tmp*")]
        assert not temps, (folder, temps, tails(run))

    filler.unlink()
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "rl",
            "@",
            str(run.run_dir / "config.toml"),
            "--resume",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert again.returncode == 0, again.stdout + again.stderr
    total = WARMUP + STEPS
    assert sorted(run_log_steps(metrics)) == list(range(1, total + 1))
    lineage = surviving_lineage((run.run_dir / "logs" / "trainer.log").read_text())
    assert lineage == list(range(1, total + 1)), lineage
    assert "already trained with other data" not in again.stdout
