"""Episodes of an agent program through the session gateway (`type = "agent"` tasks).

Per episode: a session with a fresh key, the agent run (a sandboxed program, or a request
to an agent service) until it exits or the deadline, then the key revoked and the trace
turned into samples. An episode that hit its deadline, crashed, never called, lost a turn
to an inference error, or owes a reward it did not post is returned `dropped` (counted,
never trained): what is trained is always a whole episode.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any

import aiohttp

from tidal.orchestrator.completions import Completion, ToolStats
from tidal.orchestrator.gateway.server import Gateway
from tidal.orchestrator.gateway.session import AgentSession
from tidal.orchestrator.gateway.trace import EpisodeTrace
from tidal.orchestrator.scoring.sandbox import Sandbox
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.tasks.agent import AgentTask
from tidal.orchestrator.tasks.base import Problem
from tidal.text.tool_calls import ToolCallParser

SPEC_FILE = "tidal_agent.json"
NO_CONTEXT_LIMIT = 1 << 30
STDERR_KEPT = 2000
STDERR_LOGGED = 300
JSON_BODY = {"Content-Type": "application/json"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOutcome:
    output: str
    failure: str = ""
    stderr: str = ""
    """The end of the agent's stderr, logged when the episode is dropped."""


def problem_json(problem: Problem, messages: list[dict[str, Any]]) -> str:
    """What the agent is given, as JSON text: the problem's prompt, chat messages, tools
    and metadata (what JSON cannot hold as it is, such as a date, as its text). Encoded
    once per group, whose episodes are all given the same."""
    given = {
        "uid": problem.uid,
        "prompt": problem.prompt,
        "messages": messages,
        "tools": list(problem.tools),
        "metadata": problem.metadata,
    }
    return json.dumps(given, default=str)


class ProgramRunner:
    """The agent as a program started per episode in the sandbox, behind the launcher."""

    def __init__(self, task: AgentTask) -> None:
        limits = task.config.sandbox.model_copy(update={"wall_s": task.config.deadline_s})
        self.sandbox = Sandbox(limits)
        self.command = task.command
        self.files = task.files

    @cached_property
    def launcher(self) -> str:
        return resources.files("tidal.orchestrator.gateway").joinpath("launcher.py").read_text()

    async def run(
        self, gateway: Gateway, session: AgentSession, key: str, problem: str
    ) -> RunOutcome:
        spec = {
            "socket": str(gateway.socket_path),
            "session_id": session.id,
            "key": key,
            "command": self.command,
            "env": {
                "OPENAI_API_KEY": key,
                "TIDAL_SESSION_ID": session.id,
                "TIDAL_PROBLEM": problem,
            },
        }
        assert gateway.socket_path is not None  # a started gateway
        result = await self.sandbox.run(
            self.launcher,
            stdin=problem,
            files={SPEC_FILE: json.dumps(spec)},
            # the socket's folder holds the socket alone; /tmp around it stays private
            read_only=[*self.files, str(gateway.socket_path.parent)],
        )
        stderr = result.stderr[-STDERR_KEPT:]
        if result.killed_reason is not None:
            return RunOutcome(result.stdout, f"killed_{result.killed_reason}", stderr)
        if result.exit_code != 0:
            return RunOutcome(result.stdout, "crashed", stderr)
        return RunOutcome(result.stdout)


class ServiceRunner:
    """The agent as a long-running HTTP service, asked to play each episode."""

    def __init__(self, task: AgentTask) -> None:
        self.url = task.config.url
        self._http: aiohttp.ClientSession | None = None

    async def run(
        self, gateway: Gateway, session: AgentSession, key: str, problem: str
    ) -> RunOutcome:
        if self._http is None:
            # one pool of kept-alive connections for all episodes; no cookies to keep
            self._http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        head = json.dumps(
            {
                "session_id": session.id,
                "base_url": gateway.url,
                "api_key": key,
                "reward_url": f"{gateway.url}/sessions/{session.id}/reward",
            }
        )
        body = f'{head[:-1]}, "problem": {problem}}}'  # the group's JSON as it is, not re-encoded
        try:
            async with self._http.post(self.url, data=body, headers=JSON_BODY) as reply:
                if reply.status != 200:
                    return RunOutcome("", "crashed")
                answer = await reply.json(content_type=None)
        except (aiohttp.ClientError, ValueError):
            return RunOutcome("", "crashed")
        output = answer.get("output") if isinstance(answer, dict) else None
        return RunOutcome(output if isinstance(output, str) else "", "")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def episode_completion(
    index: int, session: AgentSession, outcome: RunOutcome, *, self_reward: bool
) -> Completion:
    """The episode as one Completion (its last sample, earlier ones attached), or dropped."""
    samples = session.trace.samples()
    reason = session.failure or outcome.failure  # a failed call is why an agent crashes
    if not reason and not samples:
        reason = "no_calls"
    if not reason and self_reward and session.reward is None:
        reason = "no_reward"
    if reason:
        log.info(
            "agent episode %s dropped (%s)%s",
            session.id,
            reason,
            f": {outcome.stderr[-STDERR_LOGGED:]}" if outcome.stderr else "",
        )
        return Completion(index, (), (), (), stopped=False, dropped=reason)
    tools = sum((s.tools for s in samples), ToolStats())
    last = samples[-1]
    return Completion(
        index=index,
        token_ids=last.token_ids,
        logprobs=last.logprobs,
        policy_versions=last.policy_versions,
        stopped=last.stopped,
        loss_mask=last.loss_mask,
        turns=(outcome.output.strip(),),
        tools=tools,
        context_full=session.context_full,
        prompt_ids=last.prompt_ids,
        reward=session.reward,
        earlier_samples=tuple(samples[:-1]),
    )


@dataclass
class AgentEpisodes:
    """The rollout strategy of an agent task: n sessions of the agent per problem."""

    task: AgentTask
    parser: ToolCallParser

    def __post_init__(self) -> None:
        self.runner = ProgramRunner(self.task) if self.task.command else ServiceRunner(self.task)
        self.gateway: Gateway | None = None
        self._starting = asyncio.Lock()

    async def _gateway(self, sampler: Any) -> Gateway:
        async with self._starting:
            if self.gateway is None:
                gateway = Gateway(
                    sampler.prompts.tokenizer,
                    self.parser,
                    sampler.answer_of,
                    max_body_bytes=self.task.config.max_body_bytes,
                )
                await gateway.start()
                self.gateway = gateway
        return self.gateway

    async def __call__(
        self, sampler: Any, problem: Problem, prompt_ids: list[int], *, n: int, **sampling: Any
    ) -> list[Completion]:
        gateway = await self._gateway(sampler)
        messages = sampler.prompts.messages(problem)
        given = problem_json(problem, messages)
        episodes = (
            self._episode(sampler, gateway, problem, given, i, **sampling) for i in range(n)
        )
        return list(await asyncio.gather(*episodes))

    async def _episode(
        self,
        sampler: Any,
        gateway: Gateway,
        problem: Problem,
        given: str,
        index: int,
        *,
        temperature: float,
        seed: int,
        request_id: str,
    ) -> Completion:
        async def generate(
            prompt_ids: list[int], call: int, max_tokens: int, n: int
        ) -> list[Completion]:
            return await sampler.complete(
                prompt_ids,
                n=n,
                temperature=temperature,
                seed=derive_seed(seed, index, call),
                request_id=f"{request_id}-e{index}-c{call}",
                affinity=request_id,  # the group's calls share their prefixes on one replica
                max_tokens=max_tokens,
            )

        config = self.task.config
        session = AgentSession(
            problem,
            EpisodeTrace(sampler.prompts.rendering),
            generate,
            max_calls=config.max_calls,
            max_context=sampler.inference.max_seq_len or NO_CONTEXT_LIMIT,
            max_tokens=sampler.max_tokens,
        )
        key = gateway.open(session, ttl_s=config.deadline_s)
        try:
            async with asyncio.timeout(config.deadline_s):
                outcome = await self.runner.run(gateway, session, key, given)
        except TimeoutError:
            outcome = RunOutcome("", "deadline")
        finally:
            gateway.close_session(key)
        return episode_completion(index, session, outcome, self_reward=config.self_reward)

    async def aclose(self) -> None:
        if isinstance(self.runner, ServiceRunner):
            await self.runner.close()
        if self.gateway is not None:
            await self.gateway.close()
            self.gateway = None
