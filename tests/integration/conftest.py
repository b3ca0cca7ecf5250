"""Helpers for integration tests: run `tidal rl` as a real process tree on loopback."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.agent_programs import agent_folder
from tests.helpers.processes import processes_with, stack_scratch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "configs" / "default.toml"
LOOKUP_CONFIG = ROOT / "configs" / "lookup.toml"
LOOKUP_WARMUP_STEPS = 200
"""Past the warm-up step (about 155) where the tiny model learns to copy a key and a value."""


@dataclass
class LaunchedRun:
    """A launched `tidal rl`. Its output is read as it comes, on a thread: the launcher
    echoes the orchestrator's log, and a pipe nobody reads would block it once full."""

    process: subprocess.Popen[str]
    run_dir: Path
    _lines: list[str] = field(default_factory=list, init=False)
    _reader: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)

    def wait_for_config(self, timeout: float = 60) -> dict:  # type: ignore[type-arg]
        path = self.run_dir / "config.toml"
        deadline = time.monotonic() + timeout
        while not path.is_file():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {path}; launcher output:\n{self.output()}")
            time.sleep(0.1)
        return tomllib.loads(path.read_text())

    def children(self) -> list[int]:
        """Pids of live processes whose command line names this run's config: the
        launcher's children and what they forked, such as the orchestrator's verifier
        workers (zombies have an empty command line and do not count)."""
        return processes_with(str(self.run_dir / "config.toml").encode())

    def services(self) -> list[int]:
        """The launcher's own children among `children()`: one process per service."""
        launcher = self.process.pid
        return [pid for pid in self.children() if _parent(pid) == launcher]

    def output(self) -> str:
        """All the launcher wrote, once it has exited; what it wrote so far before."""
        if self.process.poll() is not None:
            self._reader.join(timeout=30)  # the pipe closes once the launcher is gone
        text = "".join(self._lines)
        return text if self.process.poll() is not None else text + "(still running)"

    def communicate(self, timeout: float) -> str:
        """Wait for the launcher to exit (`subprocess.TimeoutExpired` past `timeout`); its
        output."""
        self.process.wait(timeout=timeout)
        return self.output()

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=timeout)


def tidal_rl(tmp_path: Path, *overrides: str, scratch: Path) -> LaunchedRun:
    """`tidal rl` on the default config and `overrides`, its temporary files (the
    gateway's socket folder, sandbox work dirs) in `scratch`."""
    run_dir = tmp_path / "outputs" / "it"
    command = [
        sys.executable,
        "-m",
        "tidal.cli",
        "rl",
        "@",
        str(DEFAULT_CONFIG),
        "--run.output-dir",
        str(tmp_path / "outputs"),
        "--run.name",
        "it",
        *overrides,
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch)},
    )
    return LaunchedRun(process, run_dir)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    runs: list[LaunchedRun] = []
    with stack_scratch() as scratch:

        def _launch(*overrides: str) -> LaunchedRun:
            run = tidal_rl(tmp_path, *overrides, scratch=scratch)
            runs.append(run)
            return run

        yield _launch
        for run in runs:
            if run.process.poll() is None:
                run.process.kill()
                run.process.wait()
            for pid in run.children():  # a failed test must not leave services running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def agent_dir() -> Iterator[Path]:
    """A folder for agent programs that the sandbox's uids can reach for the whole test."""
    with agent_folder() as folder:
        yield folder


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.fixture(scope="session")
def lookup_warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`configs/lookup.toml`'s supervised warm-up alone, run once for the whole suite (its
    xdist workers share it): the tiny model's version after `LOOKUP_WARMUP_STEPS` steps.
    A test trains it by RL with `from_warmed(it)` in place of a warm-up of its own."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "lookup-warmup"
    version = out / "w" / "weights" / f"v{LOOKUP_WARMUP_STEPS:06d}"
    with open(shared / "lookup-warmup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one warm-up; the other workers wait for it
        if not (version / "manifest.json").is_file():  # published whole, or not at all
            shutil.rmtree(out, ignore_errors=True)
            command = [
                sys.executable, "-m", "tidal.cli", "rl", "@", str(LOOKUP_CONFIG),
                "--run.output-dir", str(out), "--run.name", "w",
                "--orchestrator.warmup-steps", str(LOOKUP_WARMUP_STEPS),
                "--orchestrator.steps", "0",
                "--orchestrator.report.table-every", "0",
                "--grpc.shutdown-grace-s", "0.5",
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, cwd=shared, timeout=600)
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return version


def from_warmed(version: Path) -> list[str]:
    """The overrides that start a `configs/lookup.toml` run's RL from `lookup_warmed`."""
    return [
        "--trainer.model.path", str(version), "--run.tokenizer", "byte",
        "--orchestrator.warmup-steps", "0",
    ]  # fmt: skip
