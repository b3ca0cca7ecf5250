"""The RL loop: warm-start SFT steps, then generate → verify → advantages → pack → Train.

Decisions:
- Step ids are contiguous: warm-up steps are 1..W (LOSS_KIND_SFT on the task's
  reference answers), RL steps W+1..W+S. Version v is the weights after step v.
- Asynchrony is a bounded pipeline. Rollouts of step n may start once inference has
  loaded version n-1-max_async; right before Train(n) is sent, the loop starts generation
  of every later step that bound allows, so with max_async ≥ 1 step n+1's rollouts are
  produced while step n trains. With max_async = 0, step n+1 starts only after Train(n)
  returned and inference loaded version n: synchronous, on-policy.
- Each step has one `rl_step` span that opens when its generation starts and closes when
  its Train returns. Generation runs in a task entered into that span, training runs
  under it too, so every Generate and Train call (and, through them, inference, trainer
  and weightsync spans) shares the step's trace id even when steps overlap.
- Seeds: a step's prompts come from an RNG seeded by (run seed, step), and each Generate
  request carries a seed derived from (run seed, step, prompt index), so a step's data
  does not depend on how the pipeline interleaved.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry import trace

from tidal.common.tokenizer import ByteTokenizer
from tidal.orchestrator.advantages import group_advantages
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.inference_client import InferenceClient
from tidal.orchestrator.metrics import MetricsLog, StepMetrics
from tidal.orchestrator.packing import PackedMicroBatch, TrainSample, pack_micro_batches
from tidal.orchestrator.policy import PolicyGate
from tidal.orchestrator.progress import ProgressState, StepSummary
from tidal.orchestrator.rollouts import Completion, ScoredSample, drop_stale, staleness
from tidal.orchestrator.tasks.base import Problem, Task
from tidal.orchestrator.trainer_client import TrainerClient, TrainResult

log = logging.getLogger(__name__)
tracer = trace.get_tracer("tidal.orchestrator")
T = TypeVar("T")
MAX_REGENERATIONS = 3


def derive_seed(*parts: int) -> int:
    """A non-negative int63 seed mixed from integer parts (SeedSequence hashing)."""
    state = np.random.SeedSequence([p % (1 << 32) for p in parts]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1]))


@dataclass
class Generation:
    """One step's rollouts before scoring."""

    problems: list[Problem]
    prompt_ids: list[list[int]]
    completions: list[list[Completion]]
    loaded_version: int
    """Version inference had loaded when generation started."""
    seconds: float


class RLLoop:
    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        seed: int,
        task: Task,
        inference: InferenceClient,
        trainer: TrainerClient,
        gate: PolicyGate,
        progress: ProgressState,
        metrics: MetricsLog,
        tokenizer: ByteTokenizer | None = None,
    ) -> None:
        self.config = config
        self.seed = seed
        self.task = task
        self.inference = inference
        self.trainer = trainer
        self.gate = gate
        self.progress = progress
        self.metrics = metrics
        self.tokenizer = tokenizer or ByteTokenizer()
        self.max_tokens = config.sampling.max_tokens or task.max_completion_chars + 2
        self._last_finish = time.monotonic()
        self._generations: dict[int, tuple[trace.Span, asyncio.Task[Generation]]] = {}

    # ---- the loop ---------------------------------------------------------------------

    async def run(self, *, first_step: int = 1) -> None:
        """Train steps first_step..total_steps (first_step > 1 resumes a trainer's run)."""
        warmup, total = self.config.warmup_steps, self.config.total_steps
        self._last_finish = time.monotonic()
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
        """Start generation of every step ≤ newest_trained + 1 + max_async not yet started."""
        last = min(self.config.total_steps, newest_trained + 1 + self.config.max_async)
        for s in range(step, last + 1):
            if s not in self._generations:
                span = self._step_span(s, "rl")
                task = asyncio.create_task(self._in_span(span, self._generate(s)))
                self._generations[s] = (span, task)

    @staticmethod
    async def _in_span(span: trace.Span, work: Awaitable[T]) -> T:
        with trace.use_span(span, end_on_exit=False):
            return await work

    # ---- warm-up ----------------------------------------------------------------------

    async def _warmup_step(self, step: int) -> None:
        rng = random.Random(derive_seed(self.seed, step))
        count = self.config.prompts_per_step * self.config.group_size
        samples = []
        for problem in self.task.sample_many(rng, count):
            completion = self.tokenizer.encode(problem.reference, add_bos=False)
            samples.append(
                TrainSample(
                    prompt_ids=tuple(self.tokenizer.encode(problem.prompt)),
                    completion_ids=(*completion, self.tokenizer.eos_id),
                    advantage=1.0,
                )
            )
        batches = pack_micro_batches(samples, self.config.micro_batch_tokens)
        started = time.monotonic()
        result = await self._train(step, batches, sft=True)
        self._record(
            step,
            "warmup",
            result,
            batches,
            samples=len(samples),
            version=step - 1,
            train_seconds=time.monotonic() - started,
        )

    # ---- RL ---------------------------------------------------------------------------

    async def _generate(self, step: int) -> Generation:
        needed = max(0, step - 1 - self.config.max_async)
        loaded = await self.gate.wait_loaded(needed, timeout=self.config.peer_wait_s)
        started = time.monotonic()
        rng = random.Random(derive_seed(self.seed, step))
        problems = self.task.sample_many(rng, self.config.prompts_per_step)
        prompt_ids = [self.tokenizer.encode(p.prompt) for p in problems]
        sampling = self.config.sampling
        completions = await asyncio.gather(
            *(
                self.inference.generate(
                    ids,
                    n=self.config.group_size,
                    max_tokens=self.max_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    seed=derive_seed(self.seed, step, i + 1),
                    stop_token_ids=[self.tokenizer.eos_id],
                    request_id=f"step{step}-prompt{i}",
                    timeout=self.config.generate_timeout_s,
                )
                for i, ids in enumerate(prompt_ids)
            )
        )
        return Generation(problems, prompt_ids, completions, loaded, time.monotonic() - started)

    def score(self, step: int, generation: Generation) -> list[ScoredSample]:
        """Verify every completion and attach its group advantage and staleness."""
        scored = []
        for problem, prompt, group in zip(
            generation.problems, generation.prompt_ids, generation.completions, strict=True
        ):
            rewards = [self.task.verify(problem, self.tokenizer.decode(c.token_ids)) for c in group]
            advantages = group_advantages(rewards, normalize=self.config.normalize_advantages)
            for completion, reward, advantage in zip(group, rewards, advantages, strict=True):
                age = staleness(
                    step, completion.policy_versions, fallback_version=generation.loaded_version
                )
                scored.append(
                    ScoredSample(problem, tuple(prompt), completion, reward, float(advantage), age)
                )
        return scored

    async def _rl_step(self, step: int, generation: Generation) -> None:
        scored = self.score(step, generation)
        kept, dropped = drop_stale(scored, self.config.staleness_bound)
        attempts = 1
        while not kept:  # every sample too stale: regenerate with the newest loaded policy
            if attempts >= MAX_REGENERATIONS:
                raise RuntimeError(f"step {step}: all rollouts stale {attempts} times in a row")
            log.warning("step %d: all %d samples were stale; regenerating", step, dropped)
            generation = await self._generate(step)
            scored = self.score(step, generation)
            kept, more = drop_stale(scored, self.config.staleness_bound)
            dropped, attempts = dropped + more, attempts + 1
        samples = [
            TrainSample(
                prompt_ids=s.prompt_ids,
                completion_ids=s.completion.token_ids,
                advantage=s.advantage,
                completion_logprobs=s.completion.logprobs,
            )
            for s in kept
        ]
        batches = pack_micro_batches(samples, self.config.micro_batch_tokens)
        started = time.monotonic()
        self._start_generations(step + 1, newest_trained=step - 1)
        result = await self._train(step, batches, sft=False)
        self._record(
            step,
            "rl",
            result,
            batches,
            samples=len(kept),
            version=min(min(s.completion.policy_versions, default=-1) for s in kept),
            train_seconds=time.monotonic() - started,
            scored=scored,
            kept=kept,
            dropped=dropped,
            generation=generation,
        )

    async def _train(self, step: int, batches: list[PackedMicroBatch], *, sft: bool) -> TrainResult:
        result = await self.trainer.train(
            step, batches, sft=sft, timeout=self.config.train_timeout_s
        )
        if result.duplicate:
            log.warning(
                "step %d had been trained before; the trainer answered from its record", step
            )
        self.progress.saw_version(result.policy_version)
        return result

    # ---- bookkeeping ------------------------------------------------------------------

    def _record(
        self,
        step: int,
        phase: str,
        result: TrainResult,
        batches: list[PackedMicroBatch],
        *,
        samples: int,
        version: int,
        train_seconds: float,
        scored: list[ScoredSample] | None = None,
        kept: list[ScoredSample] | None = None,
        dropped: int = 0,
        generation: Generation | None = None,
    ) -> None:
        now = time.monotonic()
        seconds, self._last_finish = now - self._last_finish, now
        rewards = np.asarray([s.reward for s in scored or []], dtype=np.float64)
        lengths = [len(s.completion.token_ids) for s in scored or []]
        trained_tokens = sum(b.num_tokens for b in batches)
        generated = sum(lengths)
        versions = [v for s in kept or [] for v in s.completion.policy_versions]
        span_context = trace.get_current_span().get_span_context()
        metrics = StepMetrics(
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
            exact_fraction=float((rewards == 1.0).mean()) if rewards.size else None,
            generated_tokens=generated,
            trained_tokens=trained_tokens,
            micro_batches=len(batches),
            generate_seconds=generation.seconds if generation else 0.0,
            train_seconds=train_seconds,
            seconds=seconds,
            tokens_per_s=(generated + trained_tokens) / seconds if seconds > 0 else 0.0,
            trace_id=format(span_context.trace_id, "032x"),
            train=result.metrics,
        )
        self.metrics.append(metrics)
        self.progress.finish_step(StepSummary(step, phase, metrics.reward_mean, version, seconds))
        log.info(
            "step %d/%d %s reward %s version %d samples %d (%d stale) %.2fs %.0f tok/s",
            step,
            self.config.total_steps,
            phase,
            "-" if metrics.reward_mean is None else f"{metrics.reward_mean:.3f}",
            version,
            samples,
            dropped,
            seconds,
            metrics.tokens_per_s,
        )
