"""How a trained step becomes durable, then visible: the one order every step follows.

1. `update`: a failed write of the previous step is done again; the step's batch is
   journaled and fsynced; then its update runs, first waiting in `gate` for the previous
   step's writes, which read the live weights and optimizer state.
2. `persist`: its checkpoint when due, then its version published, one step at a time,
   so versions appear in step order and never before their checkpoint.
With `background` (one trainer process) `persist` returns once the writes started, and
they run beside the next step's forward and backward; otherwise once they ended.
docs/training.md ("Durability") says why this order makes every answered step survive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from tidal.batch.tensors import MicroBatchData
from tidal.common.errors import DiskFull, Unavailable
from tidal.common.files.durable import as_disk_full
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.persistence.journal import JournalEntry, StepJournal
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.trainer.prometheus import TrainerMetrics
from tidal.trainer.service_trainer import LossKind, ServiceTrainer
from tidal.weights.folder import StagedVersion

log = logging.getLogger(__name__)
T = TypeVar("T")

FLUSH_PUBLISH_S = 5.0
"""How long a stopping trainer waits for its last version's publish."""
SHA_KEY = "payload_sha256"
"""The checkpoint `extra` key holding the checkpointed step's payload fingerprint."""


@dataclass(eq=False)
class _Writes:
    """Step `step`'s checkpoint (when due) and then its version."""

    step: int
    checkpoint: Callable[[], Path] | None  # None: not due, or already written
    state_dict: dict[str, torch.Tensor] | None = None  # the version's weights, once copied
    done: threading.Event = field(default_factory=threading.Event)
    checkpointed: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None
    task: asyncio.Task[None] | None = None


class StepPersistence:
    def __init__(
        self,
        trainer: ServiceTrainer,
        publisher: WeightPublisher,
        *,
        checkpoints: CheckpointManager | None,
        interval: int,
        journal: StepJournal | None = None,
        background: bool = False,
        metrics: TrainerMetrics | None = None,
    ) -> None:
        self.trainer = trainer
        self.publisher = publisher
        self.checkpoints = checkpoints
        self.interval = interval
        self.journal = journal if checkpoints is not None else None
        self.background = background
        self.metrics = metrics
        self._writes: _Writes | None = None

    # ---- start-up

    async def start_fresh(self) -> None:
        """A new run: refuse existing versions, drop stale journal entries, publish version 0."""
        await self.publisher.check_fresh()
        if self.journal is not None:
            await asyncio.to_thread(self.journal.truncate, 0)
        await self._publish_now(0)

    def journaled_after(self, step: int) -> Iterator[JournalEntry]:
        """The journaled steps after the restored `step`, to replay in order."""
        return self.journal.after(step) if self.journal is not None else iter(())

    async def resumed_at(self, step: int) -> bytes:
        """After the restore and replay up to `step`: drop journal entries past it and
        publish version `step` if missing. Returns the restored checkpoint's payload
        fingerprint (empty without one)."""
        if self.journal is not None:
            await asyncio.to_thread(self.journal.truncate, step)
        if not await self.publisher.check_resumable(step):
            await self._publish_now(step)
        saved = self.checkpoints.loaded_extra.get(SHA_KEY) if self.checkpoints else None
        return saved.to_bytes(32, "big") if saved is not None else b""

    # ---- each step, in order

    async def update(
        self,
        step: int,
        batches: list[MicroBatchData],
        kind: LossKind,
        sha: bytes,
        train: Callable[[], T],
    ) -> T:
        """Run `train` (step `step`'s update) in a worker thread, durably (module docstring, 1)."""
        await self._retry_failed()
        if self.journal is not None:
            await asyncio.to_thread(self._journal, step, batches, kind, sha)
        try:
            return await asyncio.to_thread(train)
        except Exception:  # (a cancelled wait is not a failed step: the thread runs on)
            if self.journal is not None and self.trainer.trained_step < step:
                self.journal.discard(step)  # nothing committed: never to be replayed
            raise

    def gate(self) -> None:
        """In the trainer's thread, before an update changes weights or optimizer state:
        wait for the writes in flight; raise `Unavailable` if they failed."""
        writes = self._writes
        if writes is None:
            return
        writes.done.wait()
        if isinstance(writes.error, DiskFull):  # a retry cannot help: the caller stops
            raise writes.error
        if writes.error is not None:
            raise Unavailable(
                f"the checkpoint or weight version of step {writes.step} could not be "
                f"written ({writes.error}); no later step is trained until it is. Retry the "
                "step: the trainer writes it again first"
            )

    async def persist(self, step: int, sha: bytes) -> None:
        """Write step `step` (just trained) durably, then publish it (module docstring, 2).
        Raises when the writes failed and Train waits for them; a retry writes them again."""
        writes = self._writes
        if writes is None or writes.step != step:
            await self._wait()  # the previous step's: one step's writes at a time
            await self._retry_failed()
            writes = self._start(step, sha)
        else:  # a retried step whose writes failed
            await self._retry_failed()
        if not self.background:
            await self._wait()
            if writes.error is not None:
                raise writes.error

    @property
    def failed_writes(self) -> Exception | None:
        """Why the last step's writes failed, once they have (None while they run, after
        they succeeded, or once a retry started)."""
        writes = self._writes
        if writes is None or not writes.done.is_set():
            return None
        return writes.error

    # ---- shutdown

    async def finish_writes(self) -> None:
        """Wait for the checkpoint in flight, then for its publish a little: weightsync is
        usually stopping too, and `--resume` publishes a version its checkpoint holds."""
        writes = self._writes
        if writes is None or writes.task is None or writes.done.is_set():
            return
        await writes.checkpointed.wait()
        try:
            await asyncio.wait_for(asyncio.shield(writes.task), FLUSH_PUBLISH_S)
        except TimeoutError:
            log.warning(
                "stopping before version %d was published; it is in the checkpoint of step "
                "%d, and --resume publishes it",
                writes.step,
                writes.step,
            )

    async def checkpoint_last(self, sha: bytes) -> None:
        """With the journal: checkpoint the last trained step (payload `sha`) unless a
        checkpoint holds it, so the newest checkpoint is the run's last weights; then
        prune the journal entries it covers."""
        if self.journal is None or self.checkpoints is None:
            return
        step = self.trainer.trained_step
        done = self.checkpoints.complete()
        if step > 0 and not (done and done[-1][0] >= step):
            try:
                await asyncio.to_thread(self.checkpoints.save, self.trainer, extra=_extra(sha))
            except Exception as exc:  # the journal still holds the step
                log.warning("final checkpoint of step %d not written: %s", step, exc)
                return
            done = self.checkpoints.complete()
        if done:
            await asyncio.to_thread(self.journal.prune, done[-1][0])

    # ---- internals

    def _journal(
        self, step: int, batches: list[MicroBatchData], kind: LossKind, sha: bytes
    ) -> None:
        assert self.journal is not None and self.checkpoints is not None
        done = self.checkpoints.complete()
        self.journal.append(step, batches, kind, sha, covered_up_to=done[-1][0] if done else 0)

    def _start(self, step: int, sha: bytes) -> _Writes:
        checkpoint = None
        if self.checkpoints is not None and self.interval and step % self.interval == 0:
            # Nothing changed the state since this step's update: the capture is this step's.
            checkpoint = self.checkpoints.capture(self.trainer, extra=_extra(sha))
        writes = _Writes(step, checkpoint)
        writes.task = asyncio.create_task(self._write(writes))
        self._writes = writes
        return writes

    async def _write(self, writes: _Writes) -> None:
        """The weights copied, the checkpoint written (the version's folder staged beside
        it, hidden), then the version published."""
        staging: asyncio.Task[StagedVersion | None] | None = None
        try:
            if writes.state_dict is None:
                writes.state_dict = await asyncio.to_thread(self.trainer.state_dict_for_publish)
            if writes.checkpoint is not None:
                started = time.perf_counter()
                staging = asyncio.create_task(self.publisher.stage(writes.step, writes.state_dict))
                await asyncio.to_thread(writes.checkpoint)
                writes.checkpoint = None  # written: a retry after a failed publish only publishes
                if self.metrics is not None:
                    self.metrics.checkpoint_seconds.observe(time.perf_counter() - started)
            writes.checkpointed.set()
            started = time.perf_counter()
            staged = await _staged_or_none(staging, writes.step)
            await self.publisher.publish(writes.step, writes.state_dict, staged=staged)
            if self.metrics is not None:
                self.metrics.publish_seconds.observe(time.perf_counter() - started)
        except Exception as exc:  # kept for gate() and persist(); the run goes on
            log.warning("step %d: writing its checkpoint or version failed: %s", writes.step, exc)
            writes.error = as_disk_full(exc, self.publisher.root)
        finally:
            if staging is not None:
                # Let the staging thread finish; a folder the publish did not commit (the
                # checkpoint or the publish failed) is dropped: a retry stages again, and
                # the run may stop here instead.
                with contextlib.suppress(Exception):  # (a failed staging left nothing)
                    staged = await staging
                    if staged is not None and not staged.committed:
                        await asyncio.to_thread(staged.discard)
            writes.checkpointed.set()
            writes.done.set()

    async def _wait(self) -> None:
        """Wait for the writes in flight to end (their failure is for the caller to see)."""
        writes = self._writes
        if writes is not None and writes.task is not None:
            await asyncio.shield(writes.task)

    async def _retry_failed(self) -> None:
        """Write a step whose writes failed again, raising if they fail again. Writes
        still running are left alone: `gate` waits for them."""
        writes = self._writes
        if writes is None or writes.task is None or not writes.task.done() or not writes.error:
            return
        log.info("writing step %d's checkpoint/version again before training on", writes.step)
        writes.done.clear()
        writes.error = None
        writes.task = asyncio.create_task(self._write(writes))
        await asyncio.shield(writes.task)
        if isinstance(writes.error, DiskFull):
            raise writes.error
        if writes.error is not None:
            raise Unavailable(
                f"the checkpoint or weight version of step {writes.step} could not be "
                f"written ({writes.error})"
            )

    async def _publish_now(self, version: int) -> None:
        state = await asyncio.to_thread(self.trainer.state_dict_for_publish)
        await self.publisher.publish(version, state)


def _extra(sha: bytes) -> dict[str, int] | None:
    """A checkpoint's `extra` holding its step's payload fingerprint, so a restarted
    trainer answers that step's retry as a duplicate."""
    return {SHA_KEY: int.from_bytes(sha, "big")} if sha else None


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
