"""A task's rollout strategy: how its problems become completions, picked once per task.

`rollout_strategy` chooses when the generator is built: a verifiers environment plays its
own episodes, an agent program plays its episodes through the session gateway, any other
task runs its problems' turns (one call for n completions, or n episodes of tool calls, or
of environment replies when a problem has followups). The generator calls the strategy it
was handed with itself as the `Sampler`, so it never asks what kind of task a problem came
from.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ToolsConfig
from tidal.orchestrator.peers.inference_pool import InferencePool
from tidal.orchestrator.peers.inflight import InflightLimiter
from tidal.orchestrator.rollouts.agent_episodes import AgentEpisodes
from tidal.orchestrator.rollouts.episodes import CompleteFn, run_episode
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.tool_execution import ToolUse
from tidal.orchestrator.rollouts.verifiers_env import VerifiersTask
from tidal.orchestrator.tasks.agent import AgentTask
from tidal.orchestrator.tasks.base import Problem, Task
from tidal.text.tool_calls import ToolCallParser

RolloutStrategy = Callable[..., Awaitable[list[Completion]]]
"""`strategy(sampler, problem, prompt_ids, *, n, temperature, seed, request_id)`: n
completions (or episodes) of `problem`, whose prompt is `prompt_ids`."""


class Sampler(Protocol):
    """What strategies generate through (the rollout generator)."""

    inference: InferencePool
    limiter: InflightLimiter
    prompts: PromptRenderer
    max_tokens: int
    complete: CompleteFn
    answer_of: Callable[[str], str]
    top_p: Callable[[float], float]


@dataclass(frozen=True)
class Turns:
    """A problem's turns: one call for n single-turn completions, else n episodes whose
    model turns are answered by `task.env_step` (followups), or by tool results (`tools`)."""

    task: Task
    tools: ToolUse | None = None

    async def __call__(
        self, sampler: Sampler, problem: Problem, prompt_ids: list[int], *, n: int, **sampling: Any
    ) -> list[Completion]:
        if self.tools is None and not problem.followups:
            return await sampler.complete(prompt_ids, n=n, **sampling)
        # one replica per group: its episodes share the prompt's and each other turn's
        # cached prefix there (peers/inference_pool.py, affinity)
        complete = functools.partial(sampler.complete, affinity=sampling["request_id"])
        episodes = (
            run_episode(
                complete,
                self.task,
                problem,
                prompt_ids,
                sampler.prompts.episode_turns(problem),
                sampler.prompts.tokenizer,
                index=i,
                tools=self.tools,
                answer_of=sampler.answer_of,
                max_context=sampler.inference.max_seq_len,
                **sampling,
            )
            for i in range(n)
        )
        return list(await asyncio.gather(*episodes))


@dataclass(frozen=True)
class Environment:
    """A verifiers environment's own episodes, each one call through the in-flight limit."""

    task: VerifiersTask

    async def __call__(
        self, sampler: Sampler, problem: Problem, prompt_ids: list[int], **sampling: Any
    ) -> list[Completion]:
        del sampling["request_id"]  # the environment's client names its own requests
        top_p = sampler.top_p(sampling["temperature"])
        async with sampler.limiter:
            return await self.task.rollouts(
                problem, top_p=top_p, max_tokens=sampler.max_tokens, **sampling
            )


def rollout_strategy(task: Task, parser: ToolCallParser, tools: ToolsConfig) -> RolloutStrategy:
    """How `task`'s problems are rolled out, with the run's tool-call parser and budget."""
    if isinstance(task, VerifiersTask):
        return Environment(task)
    if isinstance(task, AgentTask):
        return AgentEpisodes(task, parser)
    return Turns(task, ToolUse.of(task.tools, parser, tools) if task.tools else None)
