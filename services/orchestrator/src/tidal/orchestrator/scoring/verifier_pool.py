"""Runs verifiers in warm worker processes with a per-call deadline; a failure costs one reward.

A verifier that raises, times out, dies or returns a reward outside [0, 1] scores 0 and is
counted by kind (`error`, `timeout`, `invalid`); the first failure of each kind per task is
logged. Workers are forked (by a zygote forked when the pool is built, before gRPC
starts), so plug-in tasks need not be picklable and start warm; a worker past its
deadline is killed and replaced, so a hung verifier costs its slot for `timeout_s`, never
the orchestrator (docs/tasks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import math
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from tidal.orchestrator.tasks.base import Problem, Task, Verdict

log = logging.getLogger(__name__)
FailureKind = str  # "error" | "timeout" | "invalid"
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class VerifyOutcome:
    reward: float
    scores: dict[str, float] = field(default_factory=dict)
    failure: FailureKind | None = None
    counters: dict[str, float] = field(default_factory=dict)
    """What scoring cost, summed over a step into metrics (a judge's `judge/calls`...)."""


def _as_verdict(value: Verdict | float) -> Verdict:
    if isinstance(value, Verdict):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"verify returned {type(value).__name__}, not a float or Verdict")
    return Verdict(float(value))


def _verify(task: Task, problem: Problem, completion: str | list[str]) -> Verdict:
    if isinstance(completion, list):  # an episode's model turns
        return _as_verdict(task.verify_turns(problem, completion))
    return _as_verdict(task.verify(problem, completion))


def detach_child() -> None:
    """Undo what a forked child inherits from the orchestrator's event loop; die with the parent.

    What the child inherited is frozen before its collector runs again (Python's own advice
    for fork without exec): the parent's objects can belong to threads and native libraries
    that the fork did not copy, so the child never visits them or runs their finalizers."""
    gc.freeze()
    gc.enable()
    signal.set_wakeup_fd(-1)  # the parent's event loop owns the inherited one
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


async def exchange(conn: Connection, message: object) -> Any:
    """Send `message` to a worker and await its answer without blocking the event loop
    (EOFError when the worker is gone)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        conn.send(message)
        await readable
        return conn.recv()
    finally:
        loop.remove_reader(fd)


def _serve(conn: Connection, tasks: Mapping[str, Task]) -> None:
    """A worker's loop: (problem, completion) in, ("ok", reward, scores) or ("error", why) out."""
    detach_child()
    while True:
        try:
            problem, completion = conn.recv()
        except EOFError:
            return
        try:
            verdict = _verify(tasks[problem.task], problem, completion)
            reply: tuple[Any, ...] = ("ok", verdict.reward, dict(verdict.scores))
        except Exception as exc:
            reply = ("error", "".join(traceback.format_exception_only(exc)).strip())
        conn.send(reply)


@contextlib.contextmanager
def collector_off_across_fork() -> Iterator[None]:
    """Keep the garbage collector off around a fork. The child keeps it off until
    `detach_child` has frozen what the child inherited; the parent turns it back on."""
    parent, collecting = os.getpid(), gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting and os.getpid() == parent:
            gc.enable()


def _forked(body: Callable[[], None]) -> int:
    """Fork; the child runs `body` (which starts with `detach_child`), then exits."""
    with collector_off_across_fork():
        pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid


def _zygote(requests: socket.socket, tasks: Mapping[str, Task]) -> None:
    """Fork one worker per request byte; hand back its pid and its end of a socket pair."""
    detach_child()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps killed workers
    while requests.recv(1):
        ours, theirs = socket.socketpair()

        def work(ours: socket.socket = ours, theirs: socket.socket = theirs) -> None:
            requests.close()
            ours.close()
            _serve(Connection(theirs.detach()), tasks)

        pid = _forked(work)
        theirs.close()
        socket.send_fds(requests, [str(pid).encode()], [ours.fileno()])
        ours.close()


class _Zygote:
    """The process that forks verifier workers, itself forked when the pool is built.

    Build the pool before the service starts gRPC: a process forked while gRPC threads run
    may crash in gRPC's fork handlers, so workers are never forked from the service."""

    def __init__(self, tasks: Mapping[str, Task]) -> None:
        self.requests, theirs = socket.socketpair()

        def zygote() -> None:
            self.requests.close()
            _zygote(theirs, tasks)

        self.pid = _forked(zygote)
        theirs.close()

    def spawn(self) -> _Worker:
        self.requests.send(b"w")
        message, fds, _, _ = socket.recv_fds(self.requests, 32, 1)
        return _Worker(int(message), Connection(fds[0]))

    def close(self) -> None:
        self.requests.close()  # the zygote exits at end of file
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


class _Worker:
    def __init__(self, pid: int, conn: Connection) -> None:
        self.pid = pid
        self.conn = conn

    async def call(self, problem: Problem, completion: str | list[str]) -> tuple[Any, ...]:
        return await exchange(self.conn, (problem, completion))  # type: ignore[no-any-return]

    def kill(self) -> None:
        self.conn.close()
        deadline = time.monotonic() + 2.0
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
            while time.monotonic() < deadline:  # until the zygote has reaped it
                os.kill(self.pid, 0)
                time.sleep(0.005)


class VerifierPool:
    def __init__(
        self, tasks: Mapping[str, Task], *, timeout_s: float, max_workers: int = 4
    ) -> None:
        self.tasks = tasks
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._zygote = _Zygote(tasks)
        self._idle: asyncio.Queue[_Worker] | None = None
        self._workers: set[_Worker] = set()
        self._logged: set[tuple[str, str]] = set()

    def _pool(self) -> asyncio.Queue[_Worker]:
        if self._idle is None:  # a queue belongs to the loop that uses it
            self._idle = asyncio.Queue()
            for _ in range(self.max_workers):
                self._idle.put_nowait(self._spawn())
        return self._idle

    def _spawn(self) -> _Worker:
        worker = self._zygote.spawn()
        self._workers.add(worker)
        return worker

    def _replace(self, worker: _Worker) -> _Worker:
        self._workers.discard(worker)
        worker.kill()
        return self._spawn()

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.pid for w in self._workers]

    async def verify(self, problem: Problem, completion: str | list[str]) -> VerifyOutcome:
        idle = self._pool()
        worker = await idle.get()
        answered = False
        try:
            reply = await asyncio.wait_for(worker.call(problem, completion), self.timeout_s)
            answered = True
        except TimeoutError:
            return self._failed(problem, "timeout", f"no answer in {self.timeout_s}s")
        except Exception as exc:  # unpicklable input, or the verifier took its worker down
            return self._failed(problem, "error", f"worker call failed: {exc!r}")
        finally:  # a worker that owes an answer (or is stuck) is never reused
            idle.put_nowait(worker if answered else self._replace(worker))
        if reply[0] == "error":
            return self._failed(problem, "error", reply[1])
        _, reward, scores = reply
        if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
            return self._failed(problem, "invalid", f"reward {reward} outside [0, 1]")
        return VerifyOutcome(reward, scores)

    async def score(
        self, problem: Problem, completions: Sequence[str | list[str]]
    ) -> list[VerifyOutcome]:
        """`verify` of each completion of `problem`, concurrently, in order."""
        return list(await asyncio.gather(*(self.verify(problem, c) for c in completions)))

    def _failed(self, problem: Problem, kind: FailureKind, why: str) -> VerifyOutcome:
        if (problem.task, kind) not in self._logged:
            self._logged.add((problem.task, kind))
            log.warning(
                "verifier of task %s failed (%s) on %s: %s; reward 0 (further %s failures "
                "of this task are counted, not logged)",
                problem.task,
                kind,
                problem.uid or problem.prompt[:40],
                why,
                kind,
            )
        return VerifyOutcome(0.0, {}, kind)

    def close(self) -> None:
        for worker in list(self._workers):
            worker.kill()
        self._workers.clear()
        self._zygote.close()
