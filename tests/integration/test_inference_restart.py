"""The orchestrator rides out the loss of its only inference replica (issue 17).

The four services run as separate real processes from one resolved run config (no
launcher: restarting a child is the launcher's job, and this test plays it). Inference
is SIGKILLed after a step trained; the orchestrator must still be alive well after the
3 s in which it used to exit, say which replica it waits for, and finish every step
once inference is started again on the same address.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import prepare_run_dir
from tidal.common.config import load_config

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def _start(service: str, run_dir: Path) -> subprocess.Popen[bytes]:
    log = (run_dir / "logs" / f"{service}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", f"tidal.{service}", "@", str(run_dir / "config.toml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_orchestrator_waits_for_a_restarted_inference_and_finishes(tmp_path: Path) -> None:
    argv = [
        "@", str(ROOT / "configs" / "default.toml"),
        "--run.output-dir", str(tmp_path), "--run.name", "restart",
        "--orchestrator.steps", str(STEPS), "--orchestrator.warmup-steps", "0",
    ]  # fmt: skip
    config, _ = load_config(RunConfig, argv, environ={})
    run_dir = prepare_run_dir(config)
    procs = {name: _start(name, run_dir) for name in ("weightsync", "trainer", "inference")}
    procs["orchestrator"] = _start("orchestrator", run_dir)
    log = run_dir / "logs" / "orchestrator.log"
    try:
        deadline = time.monotonic() + 240
        while len(_steps(run_dir)) < 2:
            assert procs["orchestrator"].poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no step trained"
            time.sleep(0.2)
        procs["inference"].send_signal(signal.SIGKILL)
        procs["inference"].wait(timeout=10)
        time.sleep(5)  # it used to exit ~3 s after the loss
        assert procs["orchestrator"].poll() is None, log.read_text()[-3000:]
        assert len(_steps(run_dir)) < STEPS
        procs["inference"] = _start("inference", run_dir)
        assert procs["orchestrator"].wait(timeout=240) == 0, log.read_text()[-3000:]
        assert _steps(run_dir) == list(range(1, STEPS + 1))
        text = log.read_text()
        address = config.endpoints.inference
        assert f"no inference replica serves ({address}" in text
        assert f"inference replica 0 at {address} serves again" in text
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
