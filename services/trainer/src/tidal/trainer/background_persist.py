"""Checkpointing and publishing a trained step in the background, while the next one computes.

Issue 19: on the 33.6M reversal shape the checkpoint (model + AdamW state, ~400 MB encoded,
hashed and fsynced) and the version folder (~134 MB) took longer than the step's own
arithmetic, and both sat on the critical path because Train answered only after them.
With `trainer.background_publish` (the default, one trainer process) Train(n) answers
as soon as step n is trained, and step n's checkpoint and version are written here while
step n+1's request arrives and its forward and backward run.

Decisions:
- The durability rules do not change, only when the work happens: step n's checkpoint is
  complete (fsynced, renamed) before version n is published; on the filesystem path
  version n's folder is written beside the checkpoint under a hidden temp name
  (`WeightPublisher.stage`; weightsync's recovery never adopts temp folders) and only
  renamed and registered after it, which takes the version write (~40-250 ms on issue
  19's shapes) off the path from a trained step to the version generation waits for;
  versions are published in step order; a crash leaves at most a hidden temp folder or
  an unregistered version folder behind, as before (checkpoint.py, the senders).
- No copy of the training state is made on the critical path: the checkpoint reads the
  live weights and AdamW tensors (`CheckpointManager.snapshot` copies only the small
  rest), the version's weight copy is made in the job too, and the trainer calls
  `gate()` before its next update changes any of them. `gate()` waits for the whole
  job (checkpoint and publish) to end; at most one job is in flight, so version n+1 can
  never be published before version n. On these shapes the job ends during step n+1's
  forward/backward; when it is longer, the step waits for it (the profile shows which).
- What answering early means (docs/training.md, "Durability"): a Train answer says step
  n was trained; with the step journal (the default) it is durable too, its batch
  having been journaled before the update (step_journal.py), and a trainer killed before
  step n's job ended replays it on `--resume`. Without the journal it resumes from the
  checkpoint of step n-1 (or n, publishing version n if missing), and the orchestrator
  re-sends the steps it lost (train_delivery.py keeps them). Either way every step id is
  trained once in the lineage that survives, and no version is published that the
  trainer could not restore. `GetStatus.policy_version` is the newest version actually
  published.
- A job that fails (weightsync gone past `trainer.weightsync_timeout_s`, a full disk) is
  not lost: the next step's `gate()` refuses to update (UNAVAILABLE, nothing of that step
  committed), and the next Train first runs the failed job again from the same state
  (the weights have not moved since) before training.
- Shutdown (`flush`): the checkpoint part is waited for (local disk); the publish is
  given `FLUSH_PUBLISH_S`, since weightsync is usually stopping at the same moment. A
  version not published then is in its checkpoint, and `--resume` publishes it.
- Several trainer ranks save with collectives (DCP), so they keep the serial path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tidal.common.errors import Unavailable
from tidal.trainer.checkpoint import CheckpointManager, StateSnapshot
from tidal.trainer.prometheus import TrainerMetrics
from tidal.trainer.publisher import WeightPublisher
from tidal.weights.folder import StagedVersion

log = logging.getLogger(__name__)

FLUSH_PUBLISH_S = 5.0
"""How long a stopping trainer waits for its last version's publish (module docstring)."""


@dataclass(eq=False)
class _Job:
    """Step `step`'s durable work: its checkpoint (if due) and then its version."""

    step: int
    read_weights: Callable[[], dict[str, torch.Tensor]]  # the version's weights, copied
    snapshot: StateSnapshot | None  # None: no checkpoint due, or already saved
    state_dict: dict[str, torch.Tensor] | None = None  # read_weights' copy, once made
    done: threading.Event = field(default_factory=threading.Event)
    checkpointed: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None
    task: asyncio.Task[None] | None = None


class BackgroundPersister:
    """Runs one step's checkpoint + publish at a time in the background (module docstring)."""

    def __init__(
        self,
        publisher: WeightPublisher,
        checkpoints: CheckpointManager | None,
        metrics: TrainerMetrics | None = None,
    ) -> None:
        self.publisher = publisher
        self.checkpoints = checkpoints
        self.metrics = metrics
        self._job: _Job | None = None

    @property
    def in_flight(self) -> int | None:
        """The step whose job has not ended yet, or None."""
        job = self._job
        return job.step if job is not None and not job.done.is_set() else None

    def gate(self) -> None:
        """Called by the trainer's thread before an update changes weights or optimizer
        state: waits for the job in flight; raises `Unavailable` if it failed."""
        job = self._job
        if job is None:
            return
        job.done.wait()
        if job.error is not None:
            raise Unavailable(
                f"the checkpoint or weight version of step {job.step} could not be written "
                f"({job.error}); no later step is trained until it is. Retry the step: the "
                "trainer writes it again first"
            )

    async def settle(self) -> None:
        """Before a step trains: run a failed job again (raising if it fails again).
        A job still running is left alone: `gate()` waits for it."""
        job = self._job
        if job is None or job.task is None or not job.task.done() or job.error is None:
            return
        log.info("writing step %d's checkpoint/version again before training on", job.step)
        job.done.clear()
        job.error = None
        job.task = asyncio.create_task(self._run(job))
        await asyncio.shield(job.task)
        if job.error is not None:
            raise Unavailable(
                f"the checkpoint or weight version of step {job.step} could not be written "
                f"({job.error})"
            )

    async def wait(self) -> None:
        """Wait for the job in flight to end (its failure is `settle`'s to handle)."""
        job = self._job
        if job is not None and job.task is not None:
            await asyncio.shield(job.task)

    def start(
        self,
        step: int,
        read_weights: Callable[[], dict[str, torch.Tensor]],
        snapshot: StateSnapshot | None,
    ) -> None:
        """Begin step `step`'s job; the previous one must have ended without error.
        `read_weights` (the trainer's `state_dict_for_publish`) runs in the job too: the
        weights it copies stay put until `gate()` lets the next update through."""
        previous = self._job
        if previous is not None and (not previous.done.is_set() or previous.error is not None):
            raise RuntimeError(f"step {previous.step}'s job has not ended cleanly")
        job = _Job(step, read_weights, snapshot)
        job.task = asyncio.create_task(self._run(job))
        self._job = job

    async def flush(self) -> None:
        """Shutdown: wait for the checkpoint in flight, then for its publish a little."""
        job = self._job
        if job is None or job.task is None or job.done.is_set():
            return
        await job.checkpointed.wait()
        try:
            await asyncio.wait_for(asyncio.shield(job.task), FLUSH_PUBLISH_S)
        except TimeoutError:
            log.warning(
                "stopping before version %d was published; it is in the checkpoint of step "
                "%d, and --resume publishes it",
                job.step,
                job.step,
            )

    async def _run(self, job: _Job) -> None:
        staging: asyncio.Task[StagedVersion | None] | None = None
        try:
            if job.state_dict is None:
                job.state_dict = await asyncio.to_thread(job.read_weights)
            if job.snapshot is not None and self.checkpoints is not None:
                started = time.perf_counter()
                # The version's folder is written beside the checkpoint, hidden until the
                # checkpoint is complete (module docstring).
                staging = asyncio.create_task(self.publisher.stage(job.step, job.state_dict))
                await asyncio.to_thread(self.checkpoints.save_snapshot, job.snapshot)
                job.snapshot = None  # saved: a rerun after a failed publish only publishes
                if self.metrics is not None:
                    self.metrics.checkpoint_seconds.observe(time.perf_counter() - started)
            job.checkpointed.set()
            started = time.perf_counter()
            staged = await _staged_or_none(staging, job.step)
            await self.publisher.publish(job.step, job.state_dict, staged=staged)
            if self.metrics is not None:
                self.metrics.publish_seconds.observe(time.perf_counter() - started)
        except Exception as exc:  # kept for gate()/settle(); the run goes on
            log.warning("step %d: writing its checkpoint or version failed: %s", job.step, exc)
            job.error = exc
        finally:
            if staging is not None and not staging.done():  # the checkpoint failed first:
                with contextlib.suppress(Exception):  # let the staging thread finish before a
                    await staging  # rerun stages again (and sweeps temp folders)
            job.checkpointed.set()
            job.done.set()


async def _staged_or_none(
    staging: asyncio.Task[StagedVersion | None] | None, step: int
) -> StagedVersion | None:
    """The staged version folder, or None (not staged, or staging failed: the publish then
    writes the folder itself, so a staging error costs time, never the version)."""
    if staging is None:
        return None
    try:
        return await staging
    except Exception as exc:
        log.warning("step %d: staging its version failed (%s); writing it at publish", step, exc)
        return None
