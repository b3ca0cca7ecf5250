"""Runs verifiers in a thread pool with a per-call deadline; a failure costs one reward.

A verifier that raises, times out or returns a reward outside [0, 1] scores 0 and is
counted by kind (`error`, `timeout`, `invalid`); the first failure of each kind per task is
logged. Threads rather than processes, so plug-in tasks need not be picklable; a verifier
stuck forever keeps its thread (docs/tasks.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tidal.orchestrator.tasks.base import Problem, Task, Verdict

log = logging.getLogger(__name__)
FailureKind = str  # "error" | "timeout" | "invalid"


@dataclass(frozen=True)
class VerifyOutcome:
    reward: float
    scores: dict[str, float] = field(default_factory=dict)
    failure: FailureKind | None = None


def _as_verdict(value: Verdict | float) -> Verdict:
    if isinstance(value, Verdict):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"verify returned {type(value).__name__}, not a float or Verdict")
    return Verdict(float(value))


class VerifierPool:
    def __init__(
        self, tasks: Mapping[str, Task], *, timeout_s: float, max_workers: int = 4
    ) -> None:
        self.tasks = tasks
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="verify")
        self._logged: set[tuple[str, str]] = set()

    def _call(self, problem: Problem, completion: str | list[str]) -> Verdict:
        task = self.tasks[problem.task]
        if isinstance(completion, list):  # an episode's model turns
            return _as_verdict(task.verify_turns(problem, completion))
        return _as_verdict(task.verify(problem, completion))

    async def verify(self, problem: Problem, completion: str | list[str]) -> VerifyOutcome:
        loop = asyncio.get_running_loop()
        try:
            verdict = await asyncio.wait_for(
                loop.run_in_executor(self.pool, self._call, problem, completion), self.timeout_s
            )
        except TimeoutError:
            return self._failed(problem, "timeout", f"no answer in {self.timeout_s}s")
        except Exception as exc:
            return self._failed(problem, "error", repr(exc), exc)
        if not (math.isfinite(verdict.reward) and 0.0 <= verdict.reward <= 1.0):
            return self._failed(problem, "invalid", f"reward {verdict.reward} outside [0, 1]")
        return VerifyOutcome(verdict.reward, dict(verdict.scores))

    async def verify_all(
        self, pairs: Sequence[tuple[Problem, str | list[str]]]
    ) -> list[VerifyOutcome]:
        return list(await asyncio.gather(*(self.verify(p, c) for p, c in pairs)))

    def _failed(
        self, problem: Problem, kind: FailureKind, why: str, exc: BaseException | None = None
    ) -> VerifyOutcome:
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
                exc_info=exc,
            )
        return VerifyOutcome(0.0, {}, kind)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
