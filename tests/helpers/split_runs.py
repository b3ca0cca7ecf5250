"""A run whose orchestrator is killed mid-run and resumed, for the resume tests.

The services run as four separately started processes (the launcher ends the whole run
when the orchestrator dies, which is what it should do); `prompts.jsonl` tells how far the
orchestrator got, so the kill lands between steps of a live run, never before or after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tidal.cli.launcher import START_ORDER
from tidal.rpc.v1 import common_pb2, trainer_pb2_grpc

from ..tls_fixtures import role_channel
from .processes import stack_scratch

Services = dict[str, subprocess.Popen[bytes]]
SCRATCH: dict[Path, Path] = {}
"""Run folder → the `TMPDIR` of its services while `running_services` holds it."""


def logged_prompts(run_dir: Path, *, complete_lines_only: bool = False) -> dict[int, list[str]]:
    """Step -> prompt ids; a step logged twice (redone after a kill) keeps its last entry.
    While the orchestrator runs, a line being written may be read half: skip it then."""
    seen: dict[int, list[str]] = {}
    for line in (run_dir / "prompts.jsonl").read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if complete_lines_only:
                continue
            raise
        seen[entry["step"]] = entry["prompts"]
    return seen


def last_step_logged(run_dir: Path) -> int:
    if not (run_dir / "prompts.jsonl").is_file():
        return 0
    return max(logged_prompts(run_dir, complete_lines_only=True), default=0)


def start_service(name: str, run_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    log = (run_dir / "logs" / f"{name}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", f"tidal.{name}", "@", str(run_dir / "config.toml"), *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(SCRATCH[run_dir])},
        start_new_session=True,
    )


@contextlib.contextmanager
def running_services(run_dir: Path) -> Iterator[Services]:
    """The run's four services, started in order and stopped (TERM, then KILL) at exit;
    their temporary files (and those of services started again) in a folder of their own."""
    with stack_scratch() as scratch:
        SCRATCH[run_dir] = scratch
        services = {name: start_service(name, run_dir) for name in START_ORDER}
        try:
            yield services
        finally:
            for process in services.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in services.values():
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            del SCRATCH[run_dir]


def kill_and_resume_orchestrator(
    services: Services, run_dir: Path, *, after_step: int, last_step: int
) -> int:
    """SIGKILL the orchestrator once it has logged `after_step`, check it died before
    `last_step`, run a resumed one to its end; returns the last step logged at the kill."""
    orchestrator = services["orchestrator"]
    deadline = time.monotonic() + 240
    while last_step_logged(run_dir) < after_step:
        assert orchestrator.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.wait(timeout=30)
    killed_at = last_step_logged(run_dir)
    assert killed_at < last_step  # it died mid-run
    services["orchestrator"] = resumed = start_service(
        "orchestrator", run_dir, "--orchestrator.resume", "true"
    )
    assert resumed.wait(timeout=240) == 0, (run_dir / "logs" / "orchestrator.log").read_text()
    return killed_at


def trainer_status(run_dir: Path, address: str) -> common_pb2.StatusResponse:
    """The trainer's GetStatus, asked as the run's operator."""
    with role_channel(run_dir / "tls", "operator", address) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        return stub.GetStatus(common_pb2.StatusRequest(), timeout=10)
