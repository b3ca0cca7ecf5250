"""Exactly-once training steps: order, deduplication, compute off the loop, then publish.

Decisions:
- One asyncio.Lock serializes steps. The lock is taken *before* looking a step up, so a
  retry of the step being trained waits and then gets the stored answer (duplicate).
- Step `last + 1` trains; a step already trained is answered from the stored results
  of the last `keep_results` steps (older: FAILED_PRECONDITION); a gap is
  FAILED_PRECONDITION naming the expected step. Steps start at 1 (version 0 = init).
- The compute runs in `asyncio.to_thread` so health checks and GetStatus keep answering;
  the weights are copied to CPU in that same thread, before the lock is released.
- Background (`trainer.background_publish`, the default for one trainer process): a
  step is recorded and answered once trained; its checkpoint and version are written by
  `BackgroundPersister` before the next step's update (background_persist.py; the rules
  below hold, only later). Otherwise, serially:
- A step is recorded only after its version is published, and Train answers only then
  (policy_version == step). If publishing fails after the optimizer step, the trained
  weights are kept pending: the retry publishes them instead of training again.
- The runner serves a `ServedTrainer`: one process's `Trainer` or rank 0's
  `LeaderTrainer`, alike.
- Spans `trainer.step` and `trainer.publish` are children of the current (Train RPC) span.
- Every step is recorded with the sha256 of its payload (`tidal.batch.wire.payload_sha256`).
  A repeated step id is answered from the record only when its payload is the same; with
  other data it is refused (FAILED_PRECONDITION naming the step and both fingerprints),
  and so is a retry of a trained-but-unpublished step with other data. Only the
  orchestrator's role may call Train (tidal.common.security.authz); should a foreign step still
  get in (a stolen orchestrator key), the fingerprint makes the run's own orchestrator
  notice when its step n+1 then arrives: refused, and the orchestrator fails the run.
- Durability: with a `CheckpointManager` and `interval` > 0, every `interval`-th step is
  checkpointed *before* its version is published (the alternative, reconciling on
  `--resume` a published version newer than what the trainer can restore, would need
  weightsync to retract versions replicas may already serve). With a `StepJournal` (one
  process, the default) every step's batch is journaled before its update runs
  (step_journal.py), so every published version is in a checkpoint or the journal: a
  trainer killed at any point resumes with `--resume`, replaying the journaled steps
  after its checkpoint (`resume()`; a restored but unpublished step is published there).
  Without a journal, the versions published after the last checkpoint are lost with the
  process, and `--resume` refuses to continue under them (publisher.check_resumable).
- A step abandoned by SIGTERM (`StepAbandoned`, at a micro-batch boundary) leaves nothing
  pending: no optimizer step ran, so its retry trains it from scratch.
- The checkpoint also holds its step's payload fingerprint (checkpoint `extra`), so a
  restarted trainer answers the retry of that step (an orchestrator whose reply was lost
  with the old process) as a duplicate, with the same fingerprint check; its metrics
  are not kept, so that answer has none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch
from opentelemetry import trace

from tidal.batch.tensors import MicroBatchData
from tidal.common.errors import FailedPrecondition, Unavailable
from tidal.trainer.background_persist import BackgroundPersister
from tidal.trainer.checkpoint import CheckpointManager
from tidal.trainer.prometheus import TrainerMetrics
from tidal.trainer.publisher import WeightPublisher
from tidal.trainer.served_trainer import LossKind, ServedTrainer
from tidal.trainer.step_journal import StepJournal
from tidal.trainer.train_step import StepAbandoned, Trainer

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

KEEP_RESULTS = 100
SHA_KEY = "payload_sha256"
"""The checkpoint `extra` key holding the checkpointed step's payload fingerprint."""


@dataclass(frozen=True)
class StepResult:
    step: int
    policy_version: int
    metrics: dict[str, float] = field(default_factory=dict)
    duplicate: bool = False
    payload_sha256: bytes = b""


@dataclass(frozen=True)
class _Pending:
    """Trained but not yet published: the retry publishes these weights."""

    step: int
    metrics: dict[str, float]
    state_dict: dict[str, torch.Tensor]
    payload_sha256: bytes


class StepRunner:
    def __init__(
        self,
        trainer: ServedTrainer,
        publisher: WeightPublisher,
        *,
        keep_results: int = KEEP_RESULTS,
        checkpoints: CheckpointManager | None = None,
        checkpoint_interval: int = 0,
        background: bool = False,
        journal: StepJournal | None = None,
        metrics: TrainerMetrics | None = None,
    ) -> None:
        self.trainer = trainer
        self.metrics = metrics
        self.publisher = publisher
        self.keep_results = keep_results
        self.checkpoints = checkpoints
        self.checkpoint_interval = checkpoint_interval
        self.last_step = 0
        self.steps_trained = 0
        self.duplicates_answered = 0
        self.ready = False
        self._results: OrderedDict[int, StepResult] = OrderedDict()
        self._pending: _Pending | None = None
        self._lock = asyncio.Lock()
        self.background: BackgroundPersister | None = None
        own_saves = type(checkpoints) in (CheckpointManager, type(None))  # not the leader's
        one_process = own_saves and isinstance(trainer, Trainer)
        self.journal = journal if one_process and checkpoints is not None else None
        if background and one_process:
            # One process only: the leader's saves are collectives (background_persist.py).
            self.background = BackgroundPersister(publisher, checkpoints, metrics)
            trainer.update_gate = self.background.gate

    @property
    def policy_version(self) -> int:
        return self.publisher.newest

    async def start(self) -> None:
        """Refuse to start over existing versions, then publish version 0."""
        await self.publisher.check_fresh()
        if self.journal is not None:
            await asyncio.to_thread(self.journal.truncate, 0)
        state = await asyncio.to_thread(self.trainer.state_dict_for_publish)
        await self.publisher.publish(0, state)
        self.ready = True

    async def resume(self) -> None:
        """Continue after the trainer's restored step and the journaled steps after it
        (replayed); publish the newest version if it is missing."""
        restored = step = self.trainer.trained_step
        if self.journal is not None:
            for entry in self.journal.after(step):
                metrics = await asyncio.to_thread(
                    self.trainer.train_step, entry.step, entry.batches, entry.kind
                )
                self._record(StepResult(entry.step, entry.step, metrics,
                                        payload_sha256=entry.payload_sha256))  # fmt: skip
                step = entry.step
                log.info("replayed step %d from the step journal", step)
            await asyncio.to_thread(self.journal.truncate, step)
        if not await self.publisher.check_resumable(step):
            state = await asyncio.to_thread(self.trainer.state_dict_for_publish)
            await self.publisher.publish(step, state)
        self.last_step = step
        saved = self.checkpoints.loaded_extra.get(SHA_KEY) if self.checkpoints else None
        if step and step == restored and saved is not None:
            # The checkpointed step's fingerprint: its retry (the reply was lost with the
            # old process) is answered as a duplicate, other data under its id refused.
            self._record(StepResult(step, step, {}, payload_sha256=saved.to_bytes(32, "big")))
        self.ready = True

    async def train(
        self,
        step: int,
        batches: list[MicroBatchData],
        kind: LossKind,
        *,
        payload_sha256: bytes = b"",
    ) -> StepResult:
        """Train step `step` once; `payload_sha256` identifies its data (see module doc)."""
        if not self.ready:
            raise Unavailable("the trainer is still publishing version 0; retry shortly")
        # Shielded: if the caller goes away mid-step (its RPC is cancelled), the step still
        # finishes and is recorded, so a retry gets the stored answer instead of finding
        # the model one step ahead of the record.
        return await asyncio.shield(self._train_serialized(step, batches, kind, payload_sha256))

    async def _train_serialized(
        self, step: int, batches: list[MicroBatchData], kind: LossKind, sha: bytes
    ) -> StepResult:
        async with self._lock:
            if step <= self.last_step:
                return self._stored(step, sha)
            if step != self.last_step + 1:
                raise FailedPrecondition(
                    f"step {step} is out of order: expected step {self.last_step + 1} "
                    f"(last trained step {self.last_step})"
                )
            if self.background is not None:
                return await self._train_background(self.background, step, batches, kind, sha)
            pending = self._pending
            if pending is None or pending.step != step:
                pending = await self._compute(step, batches, kind, sha)
                self._pending = pending
                interval = self.checkpoint_interval
                if self.checkpoints is not None and interval and step % interval == 0:
                    extra = {SHA_KEY: int.from_bytes(sha, "big")} if sha else None
                    started = time.perf_counter()
                    await asyncio.to_thread(self.checkpoints.save, self.trainer, extra=extra)
                    if self.metrics is not None:
                        self.metrics.checkpoint_seconds.observe(time.perf_counter() - started)
            else:
                _check_same_payload(step, pending.payload_sha256, sha)
                log.info("step %d was trained before its publish failed; publishing again", step)
            started = time.perf_counter()
            await self.publisher.publish(step, pending.state_dict)
            if self.metrics is not None:
                self.metrics.publish_seconds.observe(time.perf_counter() - started)
            self._pending = None
            return self._record(StepResult(step, step, pending.metrics, payload_sha256=sha))

    async def _train_background(
        self,
        persister: BackgroundPersister,
        step: int,
        batches: list[MicroBatchData],
        kind: LossKind,
        sha: bytes,
    ) -> StepResult:
        """Train, answer, and leave the checkpoint and version to `persister`: the next
        step's forward/backward overlaps them (background_persist.py)."""
        pending = self._pending
        if pending is None or pending.step != step:
            await persister.settle()  # a failed job of the previous step is written first
            pending = await self._compute(step, batches, kind, sha, copy=False)  # its update
            self._pending = pending  # waited in gate(); trained, not yet handed over
        else:
            _check_same_payload(step, pending.payload_sha256, sha)
        await persister.wait()  # a skipped update (non-finite gradient) did not wait...
        await persister.settle()  # ...and the previous job may have failed meanwhile
        # Nothing changed the state since this step's update: the snapshot is this step's.
        snapshot = None
        interval = self.checkpoint_interval
        if self.checkpoints is not None and interval and step % interval == 0:
            extra = {SHA_KEY: int.from_bytes(sha, "big")} if sha else None
            snapshot = self.checkpoints.snapshot(self.trainer, extra=extra)
        persister.start(step, self.trainer.state_dict_for_publish, snapshot)
        self._pending = None
        return self._record(StepResult(step, step, pending.metrics, payload_sha256=sha))

    async def flush(self) -> None:
        """Shutdown: let the step in flight finish its checkpoint (and its publish, briefly).
        With the journal, the last trained step is then checkpointed when no checkpoint
        holds it yet, so the newest checkpoint is the run's last weights (`tidal export`,
        a later run's starting point) rather than up to `interval - 1` steps older."""
        if self.background is not None:
            await self.background.flush()
        if self.journal is None or self.checkpoints is None:
            return
        async with self._lock:
            step = self.trainer.trained_step
            done = self.checkpoints.complete()
            if step > 0 and not (done and done[-1][0] >= step):
                result = self._results.get(step)
                sha = result.payload_sha256 if result is not None else b""
                extra = {SHA_KEY: int.from_bytes(sha, "big")} if sha else None
                try:
                    await asyncio.to_thread(self.checkpoints.save, self.trainer, extra=extra)
                except Exception as exc:  # the journal still holds the step
                    log.warning("final checkpoint of step %d not written: %s", step, exc)
                    return
            done = self.checkpoints.complete()
            if done:  # the entries the newest checkpoint covers are not needed any more
                await asyncio.to_thread(self.journal.prune, done[-1][0])

    async def _compute(
        self,
        step: int,
        batches: list[MicroBatchData],
        kind: LossKind,
        sha: bytes,
        *,
        copy: bool = True,
    ) -> _Pending:
        """Train the step in a worker thread; with `copy`, also copy its weights to publish."""
        tokens = sum(b.num_tokens for b in batches)
        attributes = {"step": step, "loss": kind, "micro_batches": len(batches), "tokens": tokens}
        with tracer.start_as_current_span("trainer.step", attributes=attributes) as span:
            started = time.perf_counter()
            if self.journal is not None:  # durable before the update can change anything
                await asyncio.to_thread(self._journal, step, batches, kind, sha)
            try:
                metrics, state = await asyncio.to_thread(
                    self._train_and_copy, step, batches, kind, copy
                )
            except Exception as exc:  # (a cancelled wait is not a failed step: the thread runs on)
                if self.journal is not None and self.trainer.trained_step < step:
                    self.journal.discard(step)  # not committed: never to be replayed
                if isinstance(exc, StepAbandoned):  # SIGTERM: nothing committed or published
                    log.warning("step %d: %s", step, exc)
                raise
            span.set_attribute("loss_value", metrics["loss"])
        self.steps_trained += 1
        if self.metrics is not None:
            seconds = time.perf_counter() - started
            self.metrics.trained(step, tokens, seconds, metrics.get("loss"))
        log.info(
            "trained step %d",
            step,
            extra={"fields": {k: f"{metrics[k]:.4g}" for k in ("loss", "grad_norm", "seconds")}},
        )
        return _Pending(step, metrics, state, sha)

    def _journal(
        self, step: int, batches: list[MicroBatchData], kind: LossKind, sha: bytes
    ) -> None:
        assert self.journal is not None and self.checkpoints is not None
        done = self.checkpoints.complete()
        self.journal.append(step, batches, kind, sha, covered_up_to=done[-1][0] if done else 0)

    def _train_and_copy(
        self, step: int, batches: list[MicroBatchData], kind: LossKind, copy: bool
    ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        metrics = self.trainer.train_step(step, batches, kind)
        return metrics, self.trainer.state_dict_for_publish() if copy else {}

    def _record(self, result: StepResult) -> StepResult:
        self._results[result.step] = result
        while len(self._results) > self.keep_results:
            self._results.popitem(last=False)
        self.last_step = result.step
        return result

    def _stored(self, step: int, sha: bytes) -> StepResult:
        result = self._results.get(step)
        if result is None:
            raise FailedPrecondition(
                f"step {step} was trained long ago (last step {self.last_step}); only the "
                f"answers of the last {self.keep_results} steps are kept"
            )
        _check_same_payload(step, result.payload_sha256, sha)
        self.duplicates_answered += 1
        return replace(result, duplicate=True)


def _check_same_payload(step: int, trained: bytes, received: bytes) -> None:
    """A repeated step id must carry the payload it was trained with (both fingerprints
    known); anything else is another step under the same id, refused."""
    if trained and received and trained != received:
        raise FailedPrecondition(
            f"step {step} was already trained with other data (payload sha256 "
            f"{trained.hex()[:16]}…, this request {received.hex()[:16]}…); a step id is "
            "trained once. Another client may be training this run, or the run was "
            "restarted without --resume"
        )
