"""The RL loop: warm-start SFT steps, then generate → verify → advantages → pack → Train.

Step ids are contiguous (warm-up 1..W, then RL) and version v is the weights after step
v. The loop does no window arithmetic: `AsyncWindow` says which steps may generate, and
right before Train(n) the loop starts every later step it allows. Generations are
chained, so prompts are drawn in step order whatever the timing and the mixture state
saved before Train(n) is exact (records/resume.py). A step whose samples are all stale is
regenerated; Train goes through `TrainDelivery`. Each step is one `rl_step` trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry import trace

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import PackedMicroBatch, TrainSample, fit_to_budget
from tidal.common.errors import ConfigError
from tidal.orchestrator.completions import ScoredSample
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.evaluation import evaluate
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.peers.train_delivery import TrainDelivery
from tidal.orchestrator.peers.trainer_client import TrainerClient, TrainResult
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.orchestrator.records.report import print_live_table
from tidal.orchestrator.records.resume import (
    PROGRESS_FILE,
    SavedProgress,
    load_progress,
    previous_before,
    save_progress,
)
from tidal.orchestrator.records.run_log import RunLog, StepRecord
from tidal.orchestrator.records.run_status import ProgressState, StepSummary
from tidal.orchestrator.records.step_stats import rl_step_extras
from tidal.orchestrator.rollouts.generator import Generation, RolloutGenerator
from tidal.orchestrator.staleness import AsyncWindow
from tidal.orchestrator.tasks.base import Problem

log = logging.getLogger(__name__)
tracer = trace.get_tracer("tidal.orchestrator")
T = TypeVar("T")


def _NO_REPLY(step: int) -> TrainResult:
    """The trainer's part of a metrics line before Train(step) has answered."""
    return TrainResult(step=step, policy_version=step, metrics={}, duplicate=False)


MAX_REGENERATIONS = 3
PROMPTS_FILE = "prompts.jsonl"


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
        self.seed = seed
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
        self.run_log = run_log
        self.run_dir = run_dir
        self._last_finish = time.monotonic()
        self._last_train_end = time.monotonic()
        self._last_saved: SavedProgress | None = None  # progress.json's last content
        self._start_eval: dict[str, float] = {}  # eval.at_start's figures, for the first record
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
            self._start_eval = await self._evaluate_start()
        self._last_finish = self._last_train_end = time.monotonic()
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
        samples, truncated, dropped = self._fit(samples)
        batches = self._pack(samples)
        record = partial(
            self._record,
            step,
            "warmup",
            batches=batches,
            samples=len(samples),
            version=step - 1,
            extra={"truncated": float(truncated), "dropped/overlong": float(dropped)},
        )
        pending = record(_NO_REPLY(step), train_seconds=0.0, log_it=False)
        self._checkpoint(step, problems, before, self.mixture.state_dict(), pending)
        started = time.monotonic()
        result = await self._train(step, batches, sft=True)
        train_seconds = time.monotonic() - started
        evaluation: dict[str, float] = {}
        if step == self.config.warmup_steps and self.config.eval.after_warmup:
            await self.window.wait_loaded(step)  # the warm start's own weights
            evaluation = await self._evaluate(step)
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

    def scored_samples(self, step: int, generation: Generation) -> list[ScoredSample]:
        """Every completion (every sample of an agent episode) with its group advantage and
        staleness."""
        scored = []
        for group in generation.groups:
            for i, (episode, outcome, advantage) in enumerate(
                zip(group.completions, group.outcomes, group.advantages, strict=True)
            ):
                for completion in episode.samples():
                    age = self.window.staleness(
                        step, completion.policy_versions, fallback_version=generation.loaded_version
                    )
                    scored.append(
                        ScoredSample(
                            group.problem,
                            completion.prompt_ids or group.prompt_ids,
                            completion,
                            outcome.reward,
                            float(advantage),
                            age,
                            group.token_advantages(i) if completion is episode else (),
                        )
                    )
        return scored

    async def _rl_step(self, step: int, generation: Generation) -> None:
        scored = self.scored_samples(step, generation)
        kept, dropped = self.window.drop_stale(scored)
        attempts = 1
        while not kept:  # every sample too stale: regenerate with the newest loaded policy
            if attempts >= MAX_REGENERATIONS:
                raise RuntimeError(f"step {step}: all rollouts stale {attempts} times in a row")
            log.warning("step %d: all %d samples were stale; regenerating", step, dropped)
            generation.loaded_version = await self.window.wait_for_step(step)
            generation = await self.generator.regenerate(step, generation, attempts)
            scored = self.scored_samples(step, generation)
            kept, more = self.window.drop_stale(scored)
            dropped, attempts = dropped + more, attempts + 1
        samples, truncated, dropped_overlong = self._fit(
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
            ]
        )
        batches = self._pack(samples)
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
            self._record,
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
        self._checkpoint(
            step, generation.problems, generation.mixture_before, generation.mixture_after, pending
        )
        started = time.monotonic()
        result = await self._train(step, batches, sft=False)
        train_seconds = time.monotonic() - started
        extra.update(await self._maybe_evaluate(step))
        record(result, train_seconds=train_seconds, extra=extra)

    async def _evaluate_start(self) -> dict[str, float]:
        """Held-out figures of version 0, keyed `eval_start/...`."""
        await self.window.wait_loaded(0)
        started = time.monotonic()
        results = await evaluate(self.generator, self.mixture, self.config.eval, step=0)
        results["eval/policy_version"] = float(self.window.loaded)
        results["eval/seconds"] = time.monotonic() - started
        return {"eval_start/" + k.removeprefix("eval/"): v for k, v in results.items()}

    async def _maybe_evaluate(self, step: int) -> dict[str, float]:
        every = self.config.eval.every
        rl_index = step - self.config.warmup_steps
        if every <= 0 or (rl_index % every != 0 and step != self.config.total_steps):
            return {}
        return await self._evaluate(step)

    async def _evaluate(self, step: int) -> dict[str, float]:
        if self.config.eval.every <= 0:
            return {}
        started = time.monotonic()
        results = await evaluate(self.generator, self.mixture, self.config.eval, step=step)
        results["eval/policy_version"] = float(self.window.loaded)
        results["eval/seconds"] = time.monotonic() - started
        return results

    def _fit(self, samples: list[TrainSample]) -> tuple[list[TrainSample], int, int]:
        """Apply the over-long rule: (samples, how many were truncated, how many dropped)."""
        budget = self.config.packing.micro_batch_tokens
        out, truncated, dropped = [], 0, 0
        for sample in samples:
            if sample.num_tokens <= budget:
                out.append(sample)
                continue
            fitted = fit_to_budget(sample, budget)
            if self.config.packing.overlong_samples == "drop" or fitted is None:
                dropped += 1
            else:
                out.append(fitted)
                truncated += 1
        if not out:
            raise RuntimeError(
                f"every sample of the step is longer than "
                f"orchestrator.packing.micro_batch_tokens={budget}"
            )
        return out, truncated, dropped

    def _pack(self, samples: list[TrainSample]) -> list[PackedMicroBatch]:
        packing = self.config.packing
        per_rank = pack_for_ranks(
            samples,
            packing.micro_batch_tokens,
            self.data_parallel_ranks,
            share_prompts=packing.share_prompts,
        )
        return [b for rank in per_rank for b in rank]  # each labelled with its rank

    def _checkpoint(
        self,
        step: int,
        problems: list[Problem],
        before: dict[str, Any],
        after: dict[str, Any],
        pending: StepRecord,
    ) -> None:
        """Save the resumable progress and the step's prompts, right before Train(step).
        `pending` is the step's metrics line without the trainer's reply: a restarted
        orchestrator writes it if Train(step) was trained but its reply was lost."""
        if self._last_saved is None:  # this life's first save: chain to the previous life's
            with contextlib.suppress(ConfigError):
                self._last_saved = load_progress(self.run_dir / PROGRESS_FILE)
        saved = SavedProgress(
            step,
            before,
            after,
            self.seed,
            list(self.mixture.names),
            pending_metrics=pending.flat(),
            previous_before=previous_before(self._last_saved, step),
        )
        save_progress(self.run_dir / PROGRESS_FILE, saved)
        self._last_saved = saved
        with (self.run_dir / PROMPTS_FILE).open("a") as f:
            f.write(json.dumps({"step": step, "prompts": [p.uid for p in problems]}) + "\n")

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

    # ---- bookkeeping ------------------------------------------------------------------

    def _record(
        self,
        step: int,
        phase: str,
        result: TrainResult,
        *,
        batches: list[PackedMicroBatch],
        samples: int,
        version: int,
        train_seconds: float,
        scored: list[ScoredSample] | None = None,
        kept: list[ScoredSample] | None = None,
        dropped: int = 0,
        generation: Generation | None = None,
        extra: dict[str, Any] | None = None,
        log_it: bool = True,
    ) -> StepRecord:
        """The step's run-log record; with `log_it`, also appended, shown and counted."""
        now = time.monotonic()
        seconds = now - self._last_finish
        rewards = np.asarray([s.reward for s in scored or []], dtype=np.float64)
        lengths = [len(s.completion.token_ids) for s in scored or []]
        trained_tokens = sum(b.num_tokens for b in batches)
        generated = sum(lengths)
        versions = [v for s in kept or [] for v in s.completion.policy_versions]
        span_context = trace.get_current_span().get_span_context()
        record = StepRecord(
            step=step,
            phase=phase,
            reward_mean=float(rewards.mean()) if rewards.size else None,
            reward_std=float(rewards.std()) if rewards.size else None,
            policy_version=version,
            policy_version_max=max(versions, default=version),
            staleness_mean=float(np.mean([s.staleness for s in kept])) if kept else None,
            samples=samples,
            dropped_stale=dropped,
            completion_len_mean=float(np.mean(lengths)) if lengths else None,
            exact_fraction=float((rewards >= 1.0).mean()) if rewards.size else None,
            generated_tokens=generated,
            trained_tokens=trained_tokens,
            micro_batches=len(batches),
            generate_seconds=generation.seconds if generation else 0.0,
            train_seconds=train_seconds,
            seconds=seconds,
            tokens_per_s=(generated + trained_tokens) / seconds if seconds > 0 else 0.0,
            trace_id=format(span_context.trace_id, "032x"),
            train=result.metrics,
            extra=dict(extra or {}),
        )
        if not log_it:
            return record
        if self._start_eval:
            record.extra = {**self._start_eval, **record.extra}
            self._start_eval = {}
        self._last_finish = now
        self.run_log.append(record)
        every = self.config.report.table_every
        if every and (step % every == 0 or step == self.config.total_steps):
            print_live_table(self.run_log.records[-every:])
        self.progress.finish_step(StepSummary(step, phase, record.reward_mean, version, seconds))
        log.info(
            "step %d/%d %s reward %s version %d samples %d (%d stale) %.2fs %.0f tok/s",
            step,
            self.config.total_steps,
            phase,
            "-" if record.reward_mean is None else f"{record.reward_mean:.3f}",
            version,
            samples,
            dropped,
            seconds,
            record.tokens_per_s,
        )
        return record
