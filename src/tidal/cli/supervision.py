"""How `tidal rl` watches its children: start, restart with backoff and a budget, stop.

One supervising task per child restarts it after a doubling backoff while its budget lasts,
telling it how to continue (`ChildSpec.restart_args`); a configuration error (exit 2) or a
full disk (exit 74) is never restarted. Stopping cancels those tasks first, so nothing
restarts meanwhile, then stops the children in reverse start order (docs/operations.md,
"Supervision and restarts"). A child's output is drained even when its log cannot be
written, so a full disk never blocks a child on its own stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from tidal.common.config.loading import BaseConfig
from tidal.common.errors import EXIT_DISK_FULL
from tidal.common.observability.prometheus import RESTARTS_ENV
from tidal.common.process.launcher_watch import launcher_env, parent_death_signal

ECHOED = {"orchestrator"}
TAIL_LINES = 30
KILL_AFTER_S = 10.0
EXIT_CONFIG = 2
SUPERVISION_FILE = "supervision.json"
RESUME_ARGS = {"trainer": ["--resume"], "orchestrator": ["--orchestrator.resume", "true"]}
"""What a service is told to continue the run (on a restart, and on `tidal rl --resume`):
inference and weightsync need nothing (weightsync recovers its versions from the weights
folder, inference loads the newest)."""


class SupervisionConfig(BaseConfig):
    """How `tidal rl` restarts a service that died (the launcher's own section)."""

    max_restarts: int = Field(default=5, ge=0)
    """Restarts allowed per service over the whole run; one more crash fails the run
    (naming the service and its last log lines). 0 = never restart (any crash fails)."""
    backoff_s: float = Field(default=1.0, ge=0)
    """Wait before a service's first restart; each further restart of it waits twice as
    long as the one before, up to `max_backoff_s`."""
    max_backoff_s: float = Field(default=30.0, ge=0)
    """The longest wait before a restart."""


@dataclass(frozen=True)
class ChildSpec:
    """One service process of the run."""

    name: str
    """Unique within the run; names the log file `<run dir>/logs/<name>.log`."""
    module: str
    """Run as `python -m <module> @ <config>`."""
    args: tuple[str, ...] = ()
    """Extra arguments of the first start."""
    restart_args: tuple[str, ...] = ()
    """Extra arguments of a restart (how it continues where its last life stopped)."""
    env: dict[str, str] = field(default_factory=dict)
    can_restart: Callable[[], str | None] = lambda: None
    """Why a restart cannot work (None: it can), checked before each restart."""


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    pump_task: asyncio.Task[None] | None = None

    async def pump(self, echo: bool) -> None:
        """Copy the child's output to its log file (and the terminal), keeping a tail."""
        assert self.process.stdout is not None
        writable = True
        with self.log_path.open("ab", buffering=0) as log:
            async for raw in self.process.stdout:
                try:
                    if writable:
                        log.write(raw)
                except OSError as exc:  # a full disk: keep draining, say so once
                    writable = False
                    print(f"tidal: cannot write {self.log_path} ({exc})", file=sys.stderr)
                line = raw.decode(errors="replace").rstrip("\n")
                self.tail.append(line)
                if echo:
                    print(line, flush=True)

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)


async def start_child(
    spec: ChildSpec, config_path: Path, log_dir: Path, args: Sequence[str], *, restarts: int = 0
) -> Child:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **launcher_env(), **spec.env}
    env[RESTARTS_ENV] = str(
        restarts
    )  # the child's tidal_restarts_total (tidal.common.observability.prometheus)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        spec.module,
        "@",
        str(config_path),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=parent_death_signal(),
    )
    return Child(spec.name, process, log_dir / f"{spec.name}.log")


async def stop_all(children: Sequence[Child]) -> None:
    """SIGTERM everyone still running (reverse start order), SIGKILL after a grace period."""
    running = [c for c in reversed(children) if c.process.returncode is None]
    for child in running:
        child.signal(signal.SIGTERM)
    waits = [asyncio.create_task(c.process.wait()) for c in running]
    if not waits:
        return
    _, pending = await asyncio.wait(waits, timeout=KILL_AFTER_S)
    for child in running:
        if child.process.returncode is None:
            child.signal(signal.SIGKILL)
    if pending:
        await asyncio.wait(pending)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def backoff(config: SupervisionConfig, restart: int) -> float:
    """Seconds to wait before the `restart`-th restart (1-based) of a service."""
    return float(min(config.backoff_s * 2 ** (restart - 1), config.max_backoff_s))


class RunEnded(Exception):
    """A supervising task's way of ending the run: exit `code`, after printing `message`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Supervisor:
    def __init__(
        self,
        run_dir: Path,
        specs: Sequence[ChildSpec],
        config: SupervisionConfig,
        *,
        finisher: str = "orchestrator",
        record: str = SUPERVISION_FILE,
    ) -> None:
        self.run_dir = run_dir
        self.specs = list(specs)
        self.config = config
        self.finisher = finisher
        """The child whose exit 0 ends the run."""
        self.record = record
        """The restart record's file name in the run folder."""
        self.current: dict[str, Child] = {}
        self.pumps: list[asyncio.Task[None]] = []
        self.restarts: dict[str, int] = {s.name: 0 for s in specs}
        self.events: list[dict[str, object]] = []

    async def _start(self, spec: ChildSpec, args: Sequence[str]) -> Child:
        child = await start_child(
            spec,
            self.run_dir / "config.toml",
            self.run_dir / "logs",
            args,
            restarts=self.restarts[spec.name],
        )
        self.current[spec.name] = child
        child.pump_task = asyncio.create_task(child.pump(echo=spec.name in ECHOED))
        self.pumps.append(child.pump_task)
        return child

    async def keep_running(self, spec: ChildSpec, child: Child) -> None:
        """Restart `spec` whenever it crashes, within its budget; raises RunEnded."""
        while True:
            code = await child.process.wait()
            reason = describe_exit(code)
            if spec.name == self.finisher and code == 0:
                raise RunEnded(0, f"tidal: run finished; outputs in {self.run_dir}")
            used = self.restarts[spec.name]
            refusal = self._refusal(spec, code, used)
            self.events.append(
                {"service": spec.name, "exit": reason, "at": time.time(), "restarted": not refusal}
            )
            if refusal:
                if child.pump_task is not None:  # let its last lines reach the tail
                    await asyncio.wait([child.pump_task], timeout=2)
                if code == EXIT_DISK_FULL:  # its own message says what and where: once
                    raise RunEnded(EXIT_DISK_FULL, f"tidal: {child.name} {reason}; {refusal}")
                raise RunEnded(1, self._failure(child, reason, refusal))
            self.restarts[spec.name] = used + 1
            delay = backoff(self.config, used + 1)
            print(
                f"tidal: {spec.name} {reason}; restarting it in {delay:g}s "
                f"(restart {used + 1} of {self.config.max_restarts})",
                file=sys.stderr,
                flush=True,
            )
            self._write_record()
            await asyncio.sleep(delay)
            child = await self._start(spec, spec.restart_args)

    def _refusal(self, spec: ChildSpec, code: int, used: int) -> str | None:
        """Why this exit is not restarted (None: restart it)."""
        if code == EXIT_CONFIG:
            return "a configuration error (exit code 2) is not restarted"
        if code == EXIT_DISK_FULL:
            return (
                "the disk is full (see the message above). Free space, then run the same "
                "command with --resume: every step is done exactly once"
            )
        if used >= self.config.max_restarts:
            return (
                f"its restart budget is spent ({used} of supervision.max_restarts = "
                f"{self.config.max_restarts})"
            )
        return spec.can_restart()

    def _failure(self, child: Child, reason: str, refusal: str) -> str:
        lines = "\n".join(f"  | {line}" for line in child.tail)
        return (
            f"tidal: {child.name} {reason}; {refusal}. Its last log lines "
            f"({child.log_path}):\n{lines}"
        )

    def summary(self) -> str:
        total = sum(self.restarts.values())
        if not total:
            return "no restarts"
        counts = ", ".join(f"{k} {n}" for n, k in self.restarts.items() if k)
        return f"{total} restart(s): {counts}"

    def _write_record(self) -> None:
        record = {"restarts": self.restarts, "exits": self.events}
        with contextlib.suppress(OSError):  # a full disk: the run's exit already says so
            (self.run_dir / self.record).write_text(json.dumps(record, indent=2) + "\n")

    async def run(self) -> int:
        """Start every child in order and supervise them; the launcher's exit code."""
        interrupted = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupted.set)
        watchers: list[asyncio.Task[None]] = []
        try:
            for spec in self.specs:
                child = await self._start(spec, spec.args)
                watchers.append(asyncio.create_task(self.keep_running(spec, child)))
            stop = asyncio.create_task(interrupted.wait())
            done, _ = await asyncio.wait([*watchers, stop], return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                print("tidal: interrupted, stopping all services", file=sys.stderr)
                return 130
            ended = next(t for t in done if t is not stop).exception()
            if not isinstance(ended, RunEnded):
                raise ended if ended is not None else RuntimeError("a supervisor task returned")
            stream = sys.stdout if ended.code == 0 else sys.stderr
            print(f"{ended.message}\ntidal: {self.summary()}", file=stream, flush=True)
            return ended.code
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await stop_all(list(self.current.values()))
            for pump in self.pumps:
                pump.cancel()
            self._write_record()
