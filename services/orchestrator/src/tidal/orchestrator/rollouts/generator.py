"""One step's rollouts: draw prompts, generate groups, verify, shape rewards, advantages
(and, distilling, the teacher's per-token terms).

A group is one prompt's `group_size` completions; everything that needs the group (the
baseline, dynamic sampling, ReMax's greedy completion) happens here, so the loop sees
finished groups. Request seeds derive from (run seed, step, round, prompt), so rollouts do
not depend on how steps interleaved. Every call passes the in-flight limiter; a multi-turn
group's calls share an affinity key, so its turns find their prefix on one replica.
Each task's rollout strategy and scorer are picked once, when the generator is built; its
scorer sees each completion's answer, the reasoning split off by the run's parser.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from tidal.orchestrator.advantages import compute_advantages, has_signal, shape_reward
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.peers.inference_pool import InferencePool
from tidal.orchestrator.peers.inflight import InflightLimiter
from tidal.orchestrator.rollouts.dynamic_sampling import fill_batch
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.strategies import rollout_strategy
from tidal.orchestrator.scoring.scorers import Scorer
from tidal.orchestrator.scoring.teacher import GroupDistillation, Teacher
from tidal.orchestrator.scoring.verifier_pool import VerifyOutcome
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.tasks.base import Problem, Task
from tidal.text.reasoning import Reasoned, generation_opens, reasoning_parser
from tidal.text.tool_calls import tool_call_parser

Split = tuple[Reasoned, ...]
"""A completion split into reasoning and answer, per model turn (one for single-turn)."""


def format_score(turns: Split) -> float:
    """1.0 when every turn is reasoning then a closed block then an answer, else 0.0."""
    return float(all(t.well_formed for t in turns))


@dataclass
class Group:
    problem: Problem
    prompt_ids: tuple[int, ...]
    completions: list[Completion]
    outcomes: list[VerifyOutcome]
    shaped: list[float]
    advantages: np.ndarray  # float32 (G,)
    greedy_reward: float | None = None
    splits: list[Split] = field(default_factory=list)
    """Each completion's reasoning and answer."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Episodes left out of the group, by reason (an agent that timed out, crashed, ...)."""
    distillation: GroupDistillation | None = None
    """With a teacher: each completion token's advantage term and what scoring cost."""

    def token_advantages(self, index: int) -> tuple[float, ...]:
        """Completion `index`'s per-token advantage terms (empty: none)."""
        return () if self.distillation is None else self.distillation.terms[index]

    @property
    def rewards(self) -> list[float]:
        return [o.reward for o in self.outcomes]


@dataclass
class Generation:
    """One step's groups, ready for the staleness filter and packing."""

    groups: list[Group]
    problems: list[Problem]
    """Every problem drawn for this step, in order (the step's 'prompts seen')."""
    mixture_before: dict[str, Any]
    mixture_after: dict[str, Any]
    loaded_version: int
    """Version inference had loaded when generation started."""
    seconds: float
    policy_wait_seconds: float
    """Time spent waiting for inference to load the version this step needed."""
    rounds: int = 1
    dropped_zero_variance: int = 0
    """Groups dropped by dynamic sampling."""
    failures: dict[str, int] = field(default_factory=dict)
    """Verifier failures by kind."""
    counters: dict[str, float] = field(default_factory=dict)
    """What scoring cost (a judge's calls, cache hits, ...), summed over the step."""
    curriculum: dict[str, float] = field(default_factory=dict)
    """The curriculum's `curriculum/*` metrics after this step's outcomes."""


def distillation_stats(groups: list[Group]) -> dict[str, float]:
    """The step's mean per-token reverse KL(student ‖ teacher) over the kept groups' model
    tokens, the tokens scored, and the teacher calls' wall time summed over groups."""
    scored = [g.distillation for g in groups if g.distillation is not None]
    tokens = sum(d.tokens for d in scored)
    if not tokens:
        return {}
    return {
        "distill/reverse_kl": sum(d.reverse_kl_sum for d in scored) / tokens,
        "distill/tokens": float(tokens),
        "distill/teacher_s": sum(d.seconds for d in scored),
    }


class RolloutGenerator:
    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        seed: int,
        inference: InferencePool,
        limiter: InflightLimiter,
        prompts: PromptRenderer,
        max_tokens: int,
        tasks: Mapping[str, Task],
        scorers: Mapping[str, Scorer],
        teacher: Teacher | None = None,
    ) -> None:
        self.config = config
        self.teacher = teacher
        """Scores sampled tokens for on-policy distillation (`[orchestrator.distill]`)."""
        self.seed = seed
        self.inference = inference
        self.limiter = limiter
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.max_tokens = max_tokens
        self.tool_parser = tool_call_parser(self.tokenizer, config.tools.parser)
        self.reasoning = reasoning_parser(self.tokenizer, config.reasoning.parser)
        self.reasoning_opened = prompts.template and generation_opens(
            self.reasoning, self.tokenizer, **prompts.rendering.template_kwargs
        )
        """Whether the template's generation prompt opens the reasoning block itself."""
        self.strategies = {
            name: rollout_strategy(task, self.tool_parser, config.tools)
            for name, task in tasks.items()
        }
        """Task name → how its problems become completions (rollouts/strategies.py)."""
        self.scorers = dict(scorers)
        """Task name → what scores its completions (scoring/scorers.py)."""

    def split(self, text: str) -> Reasoned:
        """A completion's (or turn's) text as reasoning and answer."""
        return self.reasoning.split(text, opened=self.reasoning_opened)

    def answer_of(self, text: str) -> str:
        return self.split(text).answer

    def top_p(self, temperature: float) -> float:
        return self.config.sampling.top_p if temperature > 0 else 1.0

    async def complete(
        self,
        prompt_ids: list[int],
        *,
        n: int,
        temperature: float,
        seed: int,
        request_id: str,
        affinity: str = "",
        max_tokens: int | None = None,
    ) -> list[Completion]:
        async with self.limiter:
            return await self.inference.generate(
                prompt_ids,
                n=n,
                max_tokens=max_tokens or self.max_tokens,
                temperature=temperature,
                top_p=self.top_p(temperature),
                seed=seed,
                stop_token_ids=self.prompts.stop_ids,
                request_id=request_id,
                timeout=self.config.timeouts.generate_s,
                affinity=affinity,
            )

    async def rollouts(
        self,
        problem: Problem,
        prompt_ids: list[int],
        *,
        n: int,
        temperature: float,
        seed: int,
        request_id: str,
    ) -> list[Completion]:
        """n completions (or episodes) of `problem`, by its task's rollout strategy."""
        return await self.strategies[problem.task](
            self,
            problem,
            prompt_ids,
            n=n,
            temperature=temperature,
            seed=seed,
            request_id=request_id,
        )

    def splits(self, completions: list[Completion]) -> list[Split]:
        """Each completion (each turn of an episode) as reasoning and answer."""
        return [
            tuple(map(self.split, c.turns or (self.tokenizer.decode(c.token_ids),)))
            for c in completions
        ]

    async def score(
        self, problem: Problem, completions: list[Completion], splits: list[Split] | None = None
    ) -> tuple[list[VerifyOutcome], list[float]]:
        """The task scorer's outcomes of the completions' answers (`splits`, computed when
        not given), and the shaped rewards advantages use (format reward, length penalties)."""
        if splits is None:
            splits = self.splits(completions)
        texts: list[str | list[str]] = [
            [t.answer for t in s] if c.turns else s[0].answer
            for c, s in zip(completions, splits, strict=True)
        ]
        outcomes = await self.scorers[problem.task](problem, completions, texts)
        weight = self.config.reasoning.format_weight
        shaped = [
            shape_reward(
                (1.0 - weight) * o.reward + weight * format_score(s),
                len(c.policy_versions),  # model tokens (an episode's environment text is free)
                self.max_tokens,
                overlong_buffer=self.config.rewards.overlong_buffer_tokens,
                overlong_max_penalty=self.config.rewards.overlong_penalty,
                length_penalty=self.config.rewards.length_penalty,
            )
            for o, c, s in zip(outcomes, completions, splits, strict=True)
        ]
        return outcomes, shaped

    async def group(self, step: int, round_: int, index: int, problem: Problem) -> Group:
        prompt = self.prompts.prompt_ids(problem)
        tag = f"step{step}-round{round_}-prompt{index}"
        seed = derive_seed(self.seed, step, round_, index + 1)
        calls = [
            self.rollouts(
                problem,
                prompt,
                n=self.config.group_size,
                temperature=self.config.sampling.temperature,
                seed=seed,
                request_id=tag,
            )
        ]
        if self.config.advantages.algorithm == "remax":
            calls.append(
                self.rollouts(
                    problem, prompt, n=1, temperature=0.0, seed=seed, request_id=tag + "-greedy"
                )
            )
        results = await asyncio.gather(*calls)
        dropped = Counter(c.dropped for r in results for c in r if c.dropped)
        completions = [c for c in results[0] if not c.dropped]  # counted, never trained
        if not completions:
            return Group(
                problem, tuple(prompt), [], [], [], np.zeros(0, np.float32), dropped=dropped
            )
        splits = self.splits(completions)
        outcomes, shaped = await self.score(problem, completions, splits)
        greedy_reward = None
        if self.config.advantages.algorithm == "remax":
            greedy = [c for c in results[1] if not c.dropped]
            _, greedy_shaped = await self.score(problem, greedy)
            greedy_reward = greedy_shaped[0] if greedy_shaped else float(np.mean(shaped))
        advantages = compute_advantages(
            self.config.advantages.algorithm,
            shaped,
            normalize=self.config.advantages.normalize,
            greedy_reward=greedy_reward,
        )
        distillation = None
        if self.teacher is not None:
            distillation = await self.teacher.score_group(problem, prompt, completions, tag=tag)
            if self.config.distill.mode == "replace":  # pure distillation: no reward term
                advantages = np.zeros_like(advantages)
        return Group(
            problem, tuple(prompt), completions, outcomes, shaped, advantages, greedy_reward,
            splits, dropped, distillation,
        )  # fmt: skip

    async def generate_step(
        self, step: int, mixture: TaskMixture, *, loaded_version: int, policy_wait: float
    ) -> Generation:
        """Draw and generate this step's groups (with dynamic sampling, several rounds)."""
        started = time.monotonic()
        before = mixture.state_dict()

        async def generate(round_: int, problems: list[Problem]) -> list[Group]:
            groups = list(
                await asyncio.gather(
                    *(self.group(step, round_, i, p) for i, p in enumerate(problems))
                )
            )
            for group in groups:  # in draw order, before the next round or step draws
                mixture.observe(group.problem, group.rewards)
            return groups

        batch = await fill_batch(
            self.config.prompts_per_step,
            draw=partial(mixture.draw, step=step),
            generate=generate,
            keep=(lambda g: has_signal(g.shaped))
            if self.config.advantages.dynamic_sampling
            else None,
            max_rounds=self.config.advantages.max_sampling_rounds,
        )
        outcomes = [o for g in batch.generated for o in g.outcomes]
        failures = Counter(o.failure for o in outcomes if o.failure)
        counters: Counter[str] = Counter()
        for outcome in outcomes:
            counters.update(outcome.counters)
        counters.update(distillation_stats(batch.kept))
        for group in batch.generated:
            counters.update({f"episode/dropped_{k}": v for k, v in group.dropped.items()})
        return Generation(
            groups=batch.kept,
            problems=batch.drawn,
            mixture_before=before,
            mixture_after=mixture.state_dict(),
            loaded_version=loaded_version,
            seconds=time.monotonic() - started,
            policy_wait_seconds=policy_wait,
            rounds=batch.rounds,
            dropped_zero_variance=batch.dropped,
            failures=dict(failures),
            counters=dict(sorted(counters.items())),
            curriculum=mixture.curriculum_metrics(),
        )

    async def aclose(self) -> None:
        """Stop what strategies serve (an agent task's gateway)."""
        for strategy in self.strategies.values():
            close = getattr(strategy, "aclose", None)
            if close is not None:
                await close()

    async def regenerate(self, step: int, generation: Generation, attempt: int) -> Generation:
        """The same step's problems generated again (after all samples came back stale)."""
        started = time.monotonic()
        groups = await asyncio.gather(
            *(
                self.group(step, 1000 * attempt, i, g.problem)
                for i, g in enumerate(generation.groups)
            )
        )
        generation.groups = list(groups)
        generation.seconds += time.monotonic() - started
        return generation
