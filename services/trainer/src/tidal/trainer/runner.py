"""Exactly-once training steps: in order, deduplicated, computed off the event loop, then
handed to persistence (step_persistence.py), which makes each durable and visible.

One lock serializes steps and is taken before a step is looked up, so a retry of the step
in flight waits and gets the stored answer. Step `last + 1` trains; a repeated step is
answered from the last `keep_results` answers when its payload fingerprint matches and
refused when it does not; a gap is refused naming the expected step. A step trained but
not yet written (its writes failed) is kept: its retry writes it instead of training again.
A Train answer means the step was trained and, with the journal, is durable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from opentelemetry import trace

from tidal.batch.tensors import MicroBatchData
from tidal.common.errors import FailedPrecondition, Unavailable
from tidal.trainer.prometheus import TrainerMetrics
from tidal.trainer.service_trainer import LossKind
from tidal.trainer.step_persistence import StepPersistence
from tidal.trainer.train_step import StepAbandoned

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

KEEP_RESULTS = 100


@dataclass(frozen=True)
class StepResult:
    step: int
    policy_version: int
    metrics: dict[str, float] = field(default_factory=dict)
    duplicate: bool = False
    payload_sha256: bytes = b""


class StepRunner:
    def __init__(
        self,
        persistence: StepPersistence,
        *,
        keep_results: int = KEEP_RESULTS,
        metrics: TrainerMetrics | None = None,
    ) -> None:
        self.persistence = persistence
        self.trainer = persistence.trainer
        self.metrics = metrics
        self.keep_results = keep_results
        self.last_step = 0
        self.steps_trained = 0
        self.duplicates_answered = 0
        self.ready = False
        self._results: OrderedDict[int, StepResult] = OrderedDict()
        self._trained: StepResult | None = None  # trained, its writes not yet under way
        self._lock = asyncio.Lock()

    @property
    def policy_version(self) -> int:
        """The newest version published."""
        return self.persistence.publisher.newest

    async def start(self) -> None:
        """A fresh trainer: publish version 0 (refusing a weightsync that has versions)."""
        await self.persistence.start_fresh()
        self.ready = True

    async def resume(self) -> None:
        """Continue after the restored step and the journaled steps after it (replayed)."""
        restored = step = self.trainer.trained_step
        for entry in self.persistence.journaled_after(step):
            metrics = await asyncio.to_thread(
                self.trainer.train_step, entry.step, entry.batches, entry.kind
            )
            self._record(StepResult(entry.step, entry.step, metrics,
                                    payload_sha256=entry.payload_sha256))  # fmt: skip
            step = entry.step
            log.info("replayed step %d from the step journal", step)
        saved = await self.persistence.resumed_at(step)
        self.last_step = step
        if step and step == restored and saved:
            # The checkpointed step's fingerprint: its retry (the reply was lost with the
            # old process) is answered as a duplicate, other data under its id refused.
            self._record(StepResult(step, step, {}, payload_sha256=saved))
        self.ready = True

    async def train(
        self,
        step: int,
        batches: list[MicroBatchData],
        kind: LossKind,
        *,
        payload_sha256: bytes = b"",
    ) -> StepResult:
        """Train step `step` once; `payload_sha256` identifies its data (module docstring)."""
        if not self.ready:
            raise Unavailable("the trainer is still publishing version 0; retry shortly")
        # Shielded: if the caller goes away mid-step (its RPC is cancelled), the step still
        # finishes and is recorded, so a retry gets the stored answer instead of finding
        # the model one step ahead of the record.
        return await asyncio.shield(self._train(step, batches, kind, payload_sha256))

    async def _train(
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
            trained = self._trained
            if trained is None or trained.step != step:
                trained = self._trained = await self._compute(step, batches, kind, sha)
            else:
                _check_same_payload(step, trained.payload_sha256, sha)
                log.info("step %d was trained before its writes failed; writing it again", step)
            await self.persistence.persist(step, sha)
            self._trained = None
            return self._record(trained)

    async def flush(self) -> None:
        """Shutdown: the step in flight finishes its checkpoint (and its publish, briefly);
        then, with the journal, the last trained step is checkpointed."""
        await self.persistence.finish_writes()
        async with self._lock:
            result = self._results.get(self.trainer.trained_step)
            await self.persistence.checkpoint_last(result.payload_sha256 if result else b"")

    async def _compute(
        self, step: int, batches: list[MicroBatchData], kind: LossKind, sha: bytes
    ) -> StepResult:
        tokens = sum(b.num_tokens for b in batches)
        attributes = {"step": step, "loss": kind, "micro_batches": len(batches), "tokens": tokens}
        with tracer.start_as_current_span("trainer.step", attributes=attributes) as span:
            started = time.perf_counter()
            try:
                metrics = await self.persistence.update(
                    step, batches, kind, sha, lambda: self.trainer.train_step(step, batches, kind)
                )
            except StepAbandoned as exc:  # SIGTERM: nothing committed or published
                log.warning("step %d: %s", step, exc)
                raise
            span.set_attribute("loss_value", metrics["loss"])
        self.steps_trained += 1
        if self.metrics is not None:
            self.metrics.trained(step, tokens, time.perf_counter() - started, metrics.get("loss"))
        log.info(
            "trained step %d",
            step,
            extra={"fields": {k: f"{metrics[k]:.4g}" for k in ("loss", "grad_norm", "seconds")}},
        )
        return StepResult(step, step, metrics, payload_sha256=sha)

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
