"""Exactly-once training steps: order, deduplication, compute off the loop, then publish.

Decisions:
- One asyncio.Lock serializes steps. The lock is taken *before* looking a step up, so a
  retry of the step being trained waits and then gets the stored answer (duplicate).
- Step `last + 1` trains; a step already trained is answered from the stored results
  of the last `keep_results` steps (older: FAILED_PRECONDITION); a gap is
  FAILED_PRECONDITION naming the expected step. Steps start at 1 (version 0 = init).
- The compute runs in `asyncio.to_thread` so health checks and GetStatus keep answering;
  the weights are copied to CPU in that same thread, before the lock is released.
- A step is recorded only after its version is published, and Train answers only then
  (policy_version == step). If publishing fails after the optimizer step, the trained
  weights are kept pending: the retry publishes them instead of training again.
- The runner serves a `ServedTrainer`: one process's `Trainer` or rank 0's
  `LeaderTrainer`, alike.
- Spans `trainer.step` and `trainer.publish` are children of the current (Train RPC) span.
- With a `CheckpointManager` and `interval` > 0, every `interval`-th step is checkpointed
  after it was published and recorded, still under the lock (so no step trains while
  the state is being written). A resumed runner starts at the checkpoint's step.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch
from opentelemetry import trace

from tidal.batch.tensors import MicroBatchData
from tidal.common.errors import FailedPrecondition, Unavailable
from tidal.trainer.checkpoint import CheckpointManager
from tidal.trainer.publisher import WeightPublisher
from tidal.trainer.served_trainer import LossKind, ServedTrainer

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

KEEP_RESULTS = 100


@dataclass(frozen=True)
class StepResult:
    step: int
    policy_version: int
    metrics: dict[str, float] = field(default_factory=dict)
    duplicate: bool = False


@dataclass(frozen=True)
class _Pending:
    """Trained but not yet published: the retry publishes these weights."""

    step: int
    metrics: dict[str, float]
    state_dict: dict[str, torch.Tensor]


class StepRunner:
    def __init__(
        self,
        trainer: ServedTrainer,
        publisher: WeightPublisher,
        *,
        keep_results: int = KEEP_RESULTS,
        checkpoints: CheckpointManager | None = None,
        checkpoint_interval: int = 0,
    ) -> None:
        self.trainer = trainer
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

    @property
    def policy_version(self) -> int:
        return self.publisher.newest

    async def start(self) -> None:
        """Refuse to start over existing versions, then publish version 0."""
        await self.publisher.check_fresh()
        state = await asyncio.to_thread(self.trainer.state_dict_for_publish)
        await self.publisher.publish(0, state)
        self.ready = True

    async def resume(self) -> None:
        """Continue after the trainer's restored step; publish that version if it is missing."""
        step = self.trainer.trained_step
        if not await self.publisher.check_resumable(step):
            state = await asyncio.to_thread(self.trainer.state_dict_for_publish)
            await self.publisher.publish(step, state)
        self.last_step = step
        self.ready = True

    async def train(self, step: int, batches: list[MicroBatchData], kind: LossKind) -> StepResult:
        if not self.ready:
            raise Unavailable("the trainer is still publishing version 0; retry shortly")
        # Shielded: if the caller goes away mid-step (its RPC is cancelled), the step still
        # finishes and is recorded, so a retry gets the stored answer instead of finding
        # the model one step ahead of the record.
        return await asyncio.shield(self._train_serialized(step, batches, kind))

    async def _train_serialized(
        self, step: int, batches: list[MicroBatchData], kind: LossKind
    ) -> StepResult:
        async with self._lock:
            if step <= self.last_step:
                return self._stored(step)
            if step != self.last_step + 1:
                raise FailedPrecondition(
                    f"step {step} is out of order: expected step {self.last_step + 1} "
                    f"(last trained step {self.last_step})"
                )
            pending = self._pending
            if pending is None or pending.step != step:
                pending = await self._compute(step, batches, kind)
                self._pending = pending
            else:
                log.info("step %d was trained before its publish failed; publishing again", step)
            await self.publisher.publish(step, pending.state_dict)
            self._pending = None
            result = self._record(StepResult(step, step, pending.metrics))
            interval = self.checkpoint_interval
            if self.checkpoints is not None and interval and step % interval == 0:
                await asyncio.to_thread(self.checkpoints.save, self.trainer)
            return result

    async def _compute(self, step: int, batches: list[MicroBatchData], kind: LossKind) -> _Pending:
        tokens = sum(b.num_tokens for b in batches)
        attributes = {"step": step, "loss": kind, "micro_batches": len(batches), "tokens": tokens}
        with tracer.start_as_current_span("trainer.step", attributes=attributes) as span:
            metrics, state = await asyncio.to_thread(self._train_and_copy, step, batches, kind)
            span.set_attribute("loss_value", metrics["loss"])
        self.steps_trained += 1
        log.info(
            "trained step %d",
            step,
            extra={"fields": {k: f"{metrics[k]:.4g}" for k in ("loss", "grad_norm", "seconds")}},
        )
        return _Pending(step, metrics, state)

    def _train_and_copy(
        self, step: int, batches: list[MicroBatchData], kind: LossKind
    ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        metrics = self.trainer.train_step(step, batches, kind)
        return metrics, self.trainer.state_dict_for_publish()

    def _record(self, result: StepResult) -> StepResult:
        self._results[result.step] = result
        while len(self._results) > self.keep_results:
            self._results.popitem(last=False)
        self.last_step = result.step
        return result

    def _stored(self, step: int) -> StepResult:
        result = self._results.get(step)
        if result is None:
            raise FailedPrecondition(
                f"step {step} was trained long ago (last step {self.last_step}); only the "
                f"answers of the last {self.keep_results} steps are kept"
            )
        self.duplicates_answered += 1
        return replace(result, duplicate=True)
