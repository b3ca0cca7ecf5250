"""Agent episodes through the session gateway, with real agent processes in the sandbox and a
real native engine serving a tiny model fitted to one tool conversation (greedy, so its
turns are known): the Python ReAct agent on the `openai` client (plain and streamed) and
a curl script each finish episodes whose samples hold exactly the ids the policy saw and
sampled; agents that hang, crash or never call are dropped with their reason."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from aiohttp import web

from tests.helpers.agent_programs import curl_command, react_command, react_files, write_agent
from tests.helpers.tool_calling_model import ANSWER, ARGS, ASK, RESULT, TOK, TOOLS, trained_weights
from tidal.inference.config import InferenceConfig
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ChatConfig
from tidal.orchestrator.rollouts.agent_episodes import (
    AgentEpisodes,
    RunOutcome,
    ServiceRunner,
    problem_json,
)
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.task_config import AGENT_SANDBOX, AgentTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.tasks.base import Problem
from tidal.text.tool_calls import tool_call_parser

VERSION = 4
PROBLEM = Problem(
    prompt=ASK["content"],
    reference=RESULT,
    task="agent",
    messages=(ASK,),
    tools=tuple(TOOLS),
    metadata={"table": {"alpha": RESULT}},
)


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[NativeEngine]:
    engine = NativeEngine(
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_batch_size=8,
        max_queue=32,
        max_step_tokens=InferenceConfig().max_step_tokens,
        kv_cache_mb=16,
    )
    await engine.start()
    try:
        await engine.update_weights(VERSION, ARGS.to_hf_config(), trained_weights())
        yield engine
    finally:
        await engine.close()


class EngineSampler:
    """What a strategy generates through, over the real engine (greedy turns)."""

    def __init__(self, engine: NativeEngine, *, fail_at_call: int = 0) -> None:
        self.engine = engine
        self.fail_at_call = fail_at_call
        """1-based call from which the engine is gone (0: never)."""
        self.prompts = PromptRenderer.from_config(TOK, ChatConfig(template="on"))
        self.inference = SimpleNamespace(max_seq_len=ARGS.max_seq_len)
        self.max_tokens = 40
        self.sent: list[list[int]] = []
        self.generated: list[list[int]] = []

    def answer_of(self, text: str) -> str:
        return text

    async def complete(self, prompt_ids: list[int], **kw: Any) -> list[Completion]:
        self.sent.append(list(prompt_ids))
        if len(self.sent) == self.fail_at_call:
            await self.engine.close()  # inference goes away mid-episode
        params = SamplingParams(
            max_tokens=kw["max_tokens"],
            temperature=0.0,
            n=kw["n"],
            stop_token_ids=list(TOK.eos_ids),
        )
        outs = sorted([c async for c in self.engine.generate(prompt_ids, params)], key=_index)
        self.generated += [list(out.token_ids) for out in outs]
        return [
            Completion(
                out.index,
                tuple(out.token_ids),
                tuple(out.logprobs),
                tuple(out.policy_versions),
                out.finish_reason == "stop",
            )
            for out in outs
        ]


def _index(completion: Any) -> int:
    return int(completion.index)


@pytest.fixture
async def engine() -> AsyncIterator[NativeEngine]:
    async with serving() as engine:
        yield engine


def strategy(command: list[str], **options: Any) -> AgentEpisodes:
    config = AgentTaskConfig(problems={"type": "lookup"}, command=command, **options)
    task = build_task(config, seed=0)
    return AgentEpisodes(task, tool_call_parser(TOK, "auto"))  # type: ignore[arg-type]


async def play(episodes: AgentEpisodes, sampler: EngineSampler, n: int = 1) -> list[Completion]:
    try:
        return await episodes(
            sampler, PROBLEM, [], n=n, temperature=0.0, seed=1, request_id="step1-prompt0"
        )
    finally:
        await episodes.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_react_agent_on_the_openai_client_trains_one_faithful_sample(
    engine: NativeEngine, tmp_path: Path, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidal.orchestrator")  # a drop logs the agent's stderr
    sampler = EngineSampler(engine)
    command = react_command(tmp_path, stream=stream)
    (episode,) = await play(strategy(command, files=react_files(tmp_path)), sampler)
    assert episode.dropped == "", caplog.text
    assert episode.turns == (ANSWER,)  # its stdout: the final answer after the tool call
    assert episode.earlier_samples == ()  # the chat loop extends one trajectory
    assert episode.tools.calls == 1 and episode.tools.parse_failures == 0
    # the second call's prompt is the first prompt + the sampled turn + the tool message
    first, second = sampler.sent
    assert second[: len(first) + len(sampler.generated[0])] == first + sampler.generated[0]
    assert list(episode.prompt_ids) == first
    ids = list(episode.token_ids)
    trained = [t for t, m in zip(ids, episode.loss_mask, strict=True) if m == 1]
    assert trained == sampler.generated[0] + sampler.generated[1]
    assert [*first, *ids][: len(second)] == second
    between = second[len(first) + len(sampler.generated[0]) :]
    assert TOK.decode(between, skip_special=False) == f"<|tool|>\n{RESULT}<eos><|assistant|>\n"
    assert all(
        lp == 0.0 for lp, m in zip(episode.logprobs, episode.loss_mask, strict=True) if m == 0
    )
    assert list(episode.policy_versions) == [VERSION] * len(trained)


# bubblewrap's namespace has loopback up; the fallback's (as root) asks the gateway for it
@pytest.mark.parametrize("isolation", ["auto", "process"])
async def test_a_curl_script_completes_an_episode_and_posts_its_reward(
    engine: NativeEngine, tmp_path: Path, isolation: str
) -> None:
    sampler = EngineSampler(engine)
    sandbox = AGENT_SANDBOX.model_copy(update={"isolation": isolation})
    episodes = strategy(curl_command(tmp_path, reward=True), self_reward=True, sandbox=sandbox)
    (episode,) = await play(episodes, sampler)
    assert episode.dropped == "" and episode.reward == 1.0
    assert list(episode.token_ids) == sampler.generated[0]
    assert episode.turns[0] == TOK.decode(sampler.generated[0]).strip()


REWRITER = """#!/bin/sh
# two calls: the second drops the first reply from its history (a rewrite)
set -eu
problem=$(cat)
body=$(printf '%s' "$problem" | jq -c '{model: "p", messages: .messages}')
for _ in 1 2; do
  curl -sS --fail-with-body -H "Authorization: Bearer $OPENAI_API_KEY" \
    -H "Content-Type: application/json" -d "$body" "$OPENAI_BASE_URL/chat/completions"
done
"""


async def test_a_history_rewrite_starts_a_new_sample_of_the_same_episode(
    engine: NativeEngine, tmp_path: Path
) -> None:
    sampler = EngineSampler(engine)
    (episode,) = await play(strategy([str(write_agent(tmp_path, "r.sh", REWRITER))]), sampler)
    assert episode.dropped == ""
    (earlier,) = episode.earlier_samples
    assert earlier.prompt_ids == episode.prompt_ids == tuple(sampler.sent[0])
    assert [*earlier.token_ids] == sampler.generated[0]
    assert [*episode.token_ids] == sampler.generated[1]


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("sleep 30", "deadline"),
        ("exit 3", "crashed"),
        ("echo no calls", "no_calls"),
    ],
)
async def test_an_agent_that_hangs_crashes_or_never_calls_is_dropped(
    engine: NativeEngine, tmp_path: Path, script: str, reason: str
) -> None:
    agent = write_agent(tmp_path, "a.sh", f"#!/bin/sh\n{script}\n")
    # Only the hanging agent needs a short deadline: the others end on their own, however
    # slowly a loaded machine starts them.
    deadline_s = 3.0 if reason == "deadline" else 60.0
    episodes = strategy([str(agent)], deadline_s=deadline_s)
    started = asyncio.get_running_loop().time()
    (episode,) = await play(episodes, EngineSampler(engine))
    assert episode.dropped == reason and episode.token_ids == ()
    assert asyncio.get_running_loop().time() - started < deadline_s + 7


PROBE = """#!/bin/sh
# try the orchestrator's port ($1) from inside the sandbox
if curl -sS -m 2 "http://127.0.0.1:$1/" >/dev/null 2>&1; then echo reached; else echo refused; fi
"""


async def test_an_agent_cannot_open_a_socket_to_a_service_port(
    engine: NativeEngine, tmp_path: Path
) -> None:
    accepted: list[Any] = []
    server = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    agent = write_agent(tmp_path, "probe.sh", PROBE)
    episodes = strategy([str(agent), str(port)], deadline_s=10.0)
    try:
        (episode,) = await play(episodes, EngineSampler(engine))
        assert episode.dropped == "no_calls"
        assert accepted == []
        with socket.socket() as s:  # the port itself is open to the host
            s.connect(("127.0.0.1", port))
    finally:
        server.close()


async def test_an_episode_whose_call_fails_in_inference_is_dropped_not_trained_half(
    engine: NativeEngine, tmp_path: Path
) -> None:
    sampler = EngineSampler(engine, fail_at_call=2)
    (episode,) = await play(strategy([str(write_agent(tmp_path, "r.sh", REWRITER))]), sampler)
    assert len(sampler.generated) == 1  # the first call was answered, the second failed
    assert episode.dropped == "inference_error" and episode.token_ids == ()


SNOOP = """#!/bin/sh
# one call, then the reward says whether the service's secret ($1) was readable
problem=$(cat)
body=$(printf '%s' "$problem" | jq -c '{model: "p", messages: .messages}')
curl -sS -o /dev/null -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H "Content-Type: application/json" -d "$body" "$OPENAI_BASE_URL/chat/completions"
if cat "$1" >/dev/null 2>&1; then r=1; else r=0; fi
curl -sS -o /dev/null -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H "Content-Type: application/json" -d "{\\"reward\\": $r}" "$TIDAL_REWARD_URL"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches uid only as root")
async def test_an_agent_cannot_read_the_services_files(
    engine: NativeEngine, tmp_path: Path
) -> None:
    secret = tmp_path / "run" / "tls" / "orchestrator.key"
    secret.parent.mkdir(parents=True)
    secret.write_text("private")
    secret.chmod(0o600)
    agent = write_agent(tmp_path, "snoop.sh", SNOOP)
    episodes = strategy([str(agent), str(secret)], self_reward=True)
    (episode,) = await play(episodes, EngineSampler(engine))
    assert episode.dropped == "" and episode.reward == 0.0


CHOOSER = """#!/bin/sh
# the model the gateway serves, then one call asking for two choices: prints both counts
set -eu
auth="Authorization: Bearer $OPENAI_API_KEY"
model=$(curl -sS --fail-with-body -H "$auth" "$OPENAI_BASE_URL/models" | jq -r '.data[0].id')
body=$(jq -c --arg m "$model" '{model: $m, messages: .messages, n: 2}')
curl -sS --fail-with-body -H "$auth" -H "Content-Type: application/json" -d "$body" \\
  "$OPENAI_BASE_URL/chat/completions" | jq -r '"\\(.model) \\(.choices | length)"'
"""


async def test_each_of_n_choices_is_a_sample_of_the_episode(
    engine: NativeEngine, tmp_path: Path
) -> None:
    sampler = EngineSampler(engine)
    agent = write_agent(tmp_path, "chooser.sh", CHOOSER)
    (episode,) = await play(strategy([str(agent)]), sampler)
    assert episode.dropped == ""
    assert episode.turns == ("tidal 2",)  # /v1/models named it; the reply held two choices
    (earlier,) = episode.earlier_samples
    assert earlier.prompt_ids == episode.prompt_ids == tuple(sampler.sent[0])
    assert [[*earlier.token_ids], [*episode.token_ids]] == sampler.generated


async def test_an_agent_service_is_given_the_problem_exactly_big_integers_and_dates_too() -> None:
    received: list[Any] = []

    async def agent(request: web.Request) -> web.Response:  # an agent service that answers at once
        received.append(await request.json())
        return web.json_response({"output": "done"})

    app = web.Application()
    app.router.add_post("/", agent)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    big = 2**70  # beyond 64 bits: a product in an arithmetic task's metadata
    problem = Problem(
        prompt="p", reference="r", task="agent", metadata={"n": big, "d": datetime.date(2026, 1, 2)}
    )
    task = SimpleNamespace(config=SimpleNamespace(url=f"http://127.0.0.1:{port}/"))
    service = ServiceRunner(task)  # type: ignore[arg-type]
    gateway = SimpleNamespace(url="http://127.0.0.1:1/v1")
    try:
        outcome = await service.run(
            gateway,  # type: ignore[arg-type]
            SimpleNamespace(id="s1"),  # type: ignore[arg-type]
            "key-1",
            problem_json(problem, [{"role": "user", "content": "p"}]),
        )
    finally:
        await service.close()
        await runner.cleanup()
    assert outcome == RunOutcome("done")
    (body,) = received
    assert body["problem"]["metadata"] == {"n": big, "d": "2026-01-02"}
    assert body["problem"]["messages"] == [{"role": "user", "content": "p"}]
    assert (body["session_id"], body["api_key"]) == ("s1", "key-1")
    assert body["reward_url"] == "http://127.0.0.1:1/v1/sessions/s1/reward"
