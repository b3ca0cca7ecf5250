"""The RL loop: warm-start SFT steps, then generate → verify → advantages → pack → Train.

Step ids are contiguous (warm-up 1..W, then RL) and version v is the weights after step
v. The loop does no window arithmetic: `AsyncWindow` says which steps may generate, and
right before Train(n) the loop starts every later step it allows. Generations are
chained, so prompts are drawn in step order whatever the timing and the mixture state
saved before Train(n) is exact (records/resume.py). A step whose samples are all stale is
regenerated; Train goes through `TrainDelivery`. Each step is one `rl_step` trace. A
step's data shaping (step_batches.py), the evaluation schedule (eval_schedule.py) and the
step's records (records/step_recorder.py) live beside it, so this reads as the pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from tidal.batch.packing import PackedMicroBatch, TrainSample
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.eval_schedule import EvalSchedule
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.peers.train_delivery import TrainDelivery
from tidal.orchestrator.peers.trainer_client import TrainerClient, TrainResult
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.orchestrator.records.run_log import RunLog
from tidal.orchestrator.records.run_status import ProgressState
from tidal.orchestrator.records.step_recorder import StepRecorder
from tidal.orchestrator.records.step_stats import rl_step_extras
from tidal.orchestrator.rollouts.generator import Generation, RolloutGenerator
from tidal.orchestrator.staleness import AsyncWindow
from tidal.orchestrator.step_batches import fit_overlong, pack_step, scored_samples

log = logging.getLogger(__name__)
tracer = trace.get_tracer("tidal.orchestrator")
T = TypeVar("T")


def _NO_REPLY(step: int) -> TrainResult:
    """The trainer's part of a metrics line before Train(step) has answered."""
    return TrainResult(step=step, policy_version=step, metrics={}, duplicate=False)


MAX_REGENERATIONS = 3


class RLLoop:
    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        seed: int,
        mixture: TaskMixture,
        generator: RolloutGenerator,
        trainer: TrainerClient,
        window: AsyncWindow,
        versions: VersionFeed,
        data_parallel_ranks: int,
        progress: ProgressState,
        run_log: RunLog,
        run_dir: Path,
    ) -> None:
        self.config = config
        self.mixture = mixture
        self.generator = generator
        self.trainer = trainer
        self.delivery = TrainDelivery(trainer, config.recovery, timeout_s=config.timeouts.train_s)
        """Train calls, retried across a trainer restart (peers/train_delivery.py)."""
        self.window = window
        self.versions = versions
        """Published versions, pushed by weightsync (the run ends when the last is)."""
        self.data_parallel_ranks = data_parallel_ranks
        """The trainer's data-parallel degree (resolved at start-up; see service.py)."""
        self.progress = progress
        self.recorder = StepRecorder(
            config, seed=seed, mixture=mixture, progress=progress, run_log=run_log, run_dir=run_dir
        )
        """Progress and prompts before each Train, the metrics line after."""
        self.evals = EvalSchedule(config, generator=generator, mixture=mixture, window=window)
        self._last_train_end = time.monotonic()
        self._generations: dict[int, tuple[trace.Span, asyncio.Task[Generation]]] = {}
        self._newest_generation: asyncio.Task[Generation] | None = None

    def steps_queued(self) -> int:
        """Later RL steps whose generation started ahead of the step being trained."""
        return len(self._generations)

    # ---- the loop ---------------------------------------------------------------------

    async def run(self, *, first_step: int = 1) -> None:
        """Train steps first_step..total_steps (first_step > 1 resumes a run)."""
        warmup, total = self.config.warmup_steps, self.config.total_steps
        if first_step == 1 and self.config.eval.at_start:
            self.recorder.start_eval = await self.evals.at_start()
        self.recorder.restart_clock()
        self._last_train_end = time.monotonic()
        try:
            for step in range(first_step, total + 1):
                if step <= warmup:
                    self.progress.state = "warmup"
                    span = self._step_span(step, "warmup")
                    with trace.use_span(span, end_on_exit=True):
                        await self._warmup_step(step)
                else:
                    self.progress.state = "rl"
                    self._start_generations(step, newest_trained=step - 1)
                    span, task = self._generations.pop(step)
                    with trace.use_span(span, end_on_exit=True):
                        await self._rl_step(step, await task)
            if first_step <= total:
                # Done when the last version is published, not only trained: the trainer
                # answers Train first (background_publish), and ending sooner would stop
                # weightsync under that last publish.
                await self.delivery.wait_published(total, self.versions)
            self.progress.state = "done"
        finally:
            for span, task in self._generations.values():
                task.cancel()
                span.end()
            self._generations.clear()

    def _step_span(self, step: int, phase: str) -> trace.Span:
        # A root span: step n+1's span is opened while step n's is current, and must not
        # become its child (each step is its own trace).
        return tracer.start_span(
            "rl_step",
            context=otel_context.Context(),
            attributes={"tidal.step": step, "tidal.phase": phase},
        )

    def _start_generations(self, step: int, *, newest_trained: int) -> None:
        """Start generation of every step the window allows that is not started yet."""
        last = min(self.config.total_steps, self.window.last_startable_step(newest_trained))
        for s in range(step, last + 1):
            if s not in self._generations:
                span = self._step_span(s, "rl")
                work = self._generate(s, after=self._newest_generation)
                task = asyncio.create_task(self._in_span(span, work))
                self._generations[s] = (span, task)
                self._newest_generation = task

    @staticmethod
    async def _in_span(span: trace.Span, work: Awaitable[T]) -> T:
        with trace.use_span(span, end_on_exit=False):
            return await work

    # ---- warm-up ----------------------------------------------------------------------

    async def _warmup_step(self, step: int) -> None:
        before = self.mixture.state_dict()
        problems = self.mixture.draw(
            self.config.prompts_per_step * self.config.group_size, step=step
        )
        samples = [self.generator.prompts.reference_sample(p) for p in problems]
        samples, truncated, dropped = fit_overlong(samples, self.config.packing)
        batches = pack_step(samples, self.config.packing, self.data_parallel_ranks)
        record = partial(
            self.recorder.record,
            step,
            "warmup",
            batches=batches,
            samples=len(samples),
            version=step - 1,
            extra={"truncated": float(truncated), "dropped/overlong": float(dropped)},
        )
        pending = record(_NO_REPLY(step), train_seconds=0.0, log_it=False)
        self.recorder.checkpoint(step, problems, before, self.mixture.state_dict(), pending)
        started = time.monotonic()
        result = await self._train(step, batches, sft=True)
        train_seconds = time.monotonic() - started
        evaluation: dict[str, float] = {}
        if step == self.config.warmup_steps and self.config.eval.after_warmup:
            await self.window.wait_loaded(step)  # the warm start's own weights
            evaluation = await self.evals.now(step)
        extra = {"truncated": float(truncated), "dropped/overlong": float(dropped), **evaluation}
        record(result, train_seconds=train_seconds, extra=extra)

    # ---- RL ---------------------------------------------------------------------------

    async def _generate(self, step: int, *, after: asyncio.Task[Generation] | None) -> Generation:
        if after is not None:
            await asyncio.wait([after])  # draw in step order; never cancels `after`
        waited = time.monotonic()
        loaded = await self.window.wait_for_step(step)
        return await self.generator.generate_step(
            step, self.mixture, loaded_version=loaded, policy_wait=time.monotonic() - waited
        )

    async def _rl_step(self, step: int, generation: Generation) -> None:
        scored = scored_samples(step, generation, self.window)
        kept, dropped = self.window.drop_stale(scored)
        attempts = 1
        while not kept:  # every sample too stale: regenerate with the newest loaded policy
            if attempts >= MAX_REGENERATIONS:
                raise RuntimeError(f"step {step}: all rollouts stale {attempts} times in a row")
            log.warning("step %d: all %d samples were stale; regenerating", step, dropped)
            generation.loaded_version = await self.window.wait_for_step(step)
            generation = await self.generator.regenerate(step, generation, attempts)
            scored = scored_samples(step, generation, self.window)
            kept, more = self.window.drop_stale(scored)
            dropped, attempts = dropped + more, attempts + 1
        samples, truncated, dropped_overlong = fit_overlong(
            [
                TrainSample(
                    prompt_ids=s.prompt_ids,
                    completion_ids=s.completion.token_ids,
                    advantage=s.advantage,
                    completion_logprobs=s.completion.logprobs,
                    completion_mask=s.completion.loss_mask,
                    completion_versions=s.completion.token_versions(),
                    token_advantages=s.token_advantages,
                )
                for s in kept
            ],
            self.config.packing,
        )
        batches = pack_step(samples, self.config.packing, self.data_parallel_ranks)
        self._start_generations(step + 1, newest_trained=step - 1)
        trainer_wait = time.monotonic() - self._last_train_end
        extra: dict[str, Any] = rl_step_extras(
            scored,
            kept,
            generation,
            step=step,
            truncated=truncated,
            dropped_overlong=dropped_overlong,
            trainer_wait_s=trainer_wait,
            reasoning=self.generator.reasoning.markers is not None,
        )
        record = partial(
            self.recorder.record,
            step,
            "rl",
            batches=batches,
            samples=len(samples),
            version=min(min(s.completion.policy_versions, default=-1) for s in kept),
            scored=scored,
            kept=kept,
            dropped=dropped,
            generation=generation,
        )
        pending = record(_NO_REPLY(step), train_seconds=0.0, extra=extra, log_it=False)
        self.recorder.checkpoint(
            step, generation.problems, generation.mixture_before, generation.mixture_after, pending
        )
        started = time.monotonic()
        result = await self._train(step, batches, sft=False)
        train_seconds = time.monotonic() - started
        extra.update(await self.evals.if_due(step))
        record(result, train_seconds=train_seconds, extra=extra)

    async def _train(self, step: int, batches: list[PackedMicroBatch], *, sft: bool) -> TrainResult:
        result = await self.delivery.train(step, batches, sft=sft)
        self._last_train_end = time.monotonic()
        # A step the trainer already trained with *other* data never gets here: it is
        # refused (FAILED_PRECONDITION, payload_sha256 differs), which fails the run.
        if result.duplicate:
            log.warning(
                "step %d had been trained before with the same data (a retry); the trainer "
                "answered from its record",
                step,
            )
        self.progress.saw_version(result.policy_version)
        return result
