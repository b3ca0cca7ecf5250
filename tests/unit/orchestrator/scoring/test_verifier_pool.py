"""A verifier that raises, hangs or returns garbage scores 0 and is counted; the rest go on."""

from __future__ import annotations

import gc
import os
import time

import pytest

from tidal.orchestrator.scoring.verifier_pool import VerifierPool
from tidal.orchestrator.tasks.base import Problem, Task, Verdict

HANG_S = 30.0
"""Far beyond the bound below: a batch the hung verifier held would take this long, while
the pool's forks on a busy machine have taken the batch to 1.5 s."""


class MoodyTask(Task):
    """Behaves according to the completion text."""

    def problem(self, index: int, *, split: str = "train") -> Problem:  # type: ignore[override]
        return Problem("p", "ok", task=self.name)

    def verify(self, problem: Problem, completion: str) -> Verdict | float:
        if completion == "raise":
            raise RuntimeError("verifier bug")
        if completion == "hang":
            time.sleep(HANG_S)
        if completion == "big":
            return 7.0
        if completion == "nan":
            return float("nan")
        if completion == "text":
            return "yes"  # type: ignore[return-value]
        return Verdict(1.0 if completion == "ok" else 0.5, {"sub": 1.0})

    @property
    def max_completion_chars(self) -> int:
        return 4


async def test_failures_are_contained_and_counted_by_kind() -> None:
    task = MoodyTask()
    task.bind(name="moody", seed=0)
    verifier = VerifierPool({"moody": task}, timeout_s=0.2)
    problem = task.problem(0)
    completions = ["ok", "raise", "hang", "big", "nan", "text", "meh"]
    started = time.monotonic()
    outcomes = await verifier.score(problem, completions)
    verifier.close()
    assert time.monotonic() - started < HANG_S / 3  # the hung verifier did not hold the batch
    assert [o.reward for o in outcomes] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    assert [o.failure for o in outcomes] == [
        None,
        "error",
        "timeout",
        "invalid",
        "invalid",
        "error",
        None,
    ]
    assert outcomes[0].scores == {"sub": 1.0}


class StuckTask(MoodyTask):
    """Hangs forever, or takes its process down, on request."""

    def verify(self, problem: Problem, completion: str) -> Verdict | float:
        if completion == "forever":
            while True:
                pass
        if completion == "die":
            os._exit(3)
        return super().verify(problem, completion)


async def test_a_hung_verifier_is_killed_and_its_slot_replaced() -> None:
    task = StuckTask()
    task.bind(name="stuck", seed=0)
    verifier = VerifierPool({"stuck": task}, timeout_s=0.3, max_workers=1)
    problem = task.problem(0)
    try:
        first = await verifier.verify(problem, "ok")
        [stuck_pid] = verifier.worker_pids
        hung = await verifier.verify(problem, "forever")
        died = await verifier.verify(problem, "die")
        after = await verifier.verify(problem, "ok")
        assert (first.reward, hung.failure, died.failure, after.reward) == (
            1.0,
            "timeout",
            "error",
            1.0,
        )
        with pytest.raises(ProcessLookupError):  # killed and reaped, not left spinning
            os.kill(stuck_pid, 0)
        assert len(verifier.worker_pids) == 1 and verifier.worker_pids != [stuck_pid]
    finally:
        verifier.close()


class Inherited:
    """A reference cycle the host process leaves for its collector."""

    def __init__(self) -> None:
        self.me = self


class CollectorTask(MoodyTask):
    """Reports what a worker's collector can reach: 1.0 when the objects inherited from the
    host are frozen (out of its reach) and the worker's own cycles are still collected."""

    def verify(self, problem: Problem, completion: str) -> Verdict | float:
        inherited = [o for o in gc.get_objects() if isinstance(o, Inherited)]
        own = Inherited()
        own_id = id(own)
        del own
        gc.collect()
        collected = not any(id(o) == own_id for o in gc.get_objects())
        return float(gc.get_freeze_count() > 0 and not inherited and collected)


async def test_a_worker_never_collects_what_it_inherited() -> None:
    """The host's garbage can belong to threads and native libraries a fork leaves behind;
    the worker's collector must not visit it, yet must still collect the worker's own."""
    task = CollectorTask()
    task.bind(name="collector", seed=0)
    collecting = gc.isenabled()
    gc.disable()  # the cycle below is still garbage, uncollected, at the fork
    try:
        Inherited()
        verifier = VerifierPool({"collector": task}, timeout_s=10.0, max_workers=1)
    finally:
        if collecting:
            gc.enable()
    try:
        outcome = await verifier.verify(task.problem(0), "ok")
    finally:
        verifier.close()
    assert (outcome.reward, outcome.failure) == (1.0, None)
    assert gc.isenabled() == collecting  # the host's collector is as it was
