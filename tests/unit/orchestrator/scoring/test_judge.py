"""The judge client against an OpenAI-compatible endpoint served in the test (the external
judge is the one thing faked): a repeated pair costs one request, a late or failing
request scores 0 and is counted once without failing, retries recover (and count as
retries, not failures), and every request carries the rubric, the model and the key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.judge import Judge
from tidal.orchestrator.scoring.model_reward_config import JudgeRewardConfig
from tidal.orchestrator.scoring.scorers import build_model_rewards
from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks import Problem

PROBLEM = Problem("abc>", "cba", task="reversal")


@dataclass
class FakeJudge:
    """An endpoint whose reply to each request `answer(body, n)` decides (n counts from 1)."""

    answer: Callable[[dict[str, Any], int], Any]
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        reply = self.answer(body, len(self.requests))
        if asyncio.iscoroutine(reply):
            reply = await reply
        if isinstance(reply, int):
            return web.Response(status=reply, text="refused")
        message = {"role": "assistant", "content": reply}
        return web.json_response({"choices": [{"index": 0, "message": message}]})

    async def models(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") == "Bearer wrong":
            return web.Response(status=401)
        return web.json_response({"data": [{"id": "judge"}]})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []

    async def start(answer: Callable[[dict[str, Any], int], Any]) -> FakeJudge:
        fake = FakeJudge(answer)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", fake.chat)
        app.router.add_get("/v1/models", fake.models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        fake.url = f"http://127.0.0.1:{port}/v1"
        return fake

    yield start
    for runner in runners:
        await runner.cleanup()


def judge_for(fake: FakeJudge, **settings: Any) -> Judge:
    return Judge(JudgeRewardConfig(base_url=fake.url, **settings))


async def test_a_reply_becomes_a_reward_and_the_request_carries_the_rubric(serve) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: "8")
    judge = Judge(
        JudgeRewardConfig(base_url=fake.url, model="grader", rubric="{prompt}|{completion}"),
        api_key="sk-test",
    )
    [outcome] = await judge.score(PROBLEM, ["cba"])
    assert outcome.reward == pytest.approx(0.8)
    assert outcome.counters["judge/calls"] == 1
    assert outcome.counters["judge/parse_failures"] == 0
    assert fake.requests[0]["model"] == "grader"
    assert fake.requests[0]["messages"] == [{"role": "user", "content": "abc>|cba"}]
    assert fake.headers[0]["Authorization"] == "Bearer sk-test"
    await judge.close()


async def test_a_repeated_pair_costs_one_request_in_flight_and_after(serve) -> None:  # type: ignore[no-untyped-def]
    async def slow(body: dict[str, Any], n: int) -> str:
        await asyncio.sleep(0.2)
        return "10"

    fake = await serve(slow)
    judge = judge_for(fake)
    outcomes = await judge.score(PROBLEM, ["cba", "cba", "abc", "cba"])
    assert [o.reward for o in outcomes] == [1.0] * 4
    assert len(fake.requests) == 2  # "cba" once, "abc" once
    again = await judge.score(PROBLEM, ["abc"])
    assert len(fake.requests) == 2
    hits = sum(o.counters.get("judge/cache_hits", 0) for o in outcomes + again)
    calls = sum(o.counters.get("judge/calls", 0) for o in outcomes + again)
    assert (hits, calls) == (3, 2)
    await judge.close()


async def test_the_cache_forgets_the_least_recently_used_pair(serve) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: "5")
    judge = judge_for(fake, cache_size=1)
    for completion in ("a", "b", "a"):
        await judge.score(PROBLEM, [completion])
    assert len(fake.requests) == 3
    await judge.close()


async def test_an_unparsable_reply_scores_zero_and_is_counted(serve) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: "I cannot say")
    judge = judge_for(fake)
    [outcome] = await judge.score(PROBLEM, ["cba"])
    assert outcome.reward == 0.0
    assert outcome.counters["judge/parse_failures"] == 1
    await judge.score(PROBLEM, ["cba"])  # answered: cached like any reply
    assert len(fake.requests) == 1
    await judge.close()


async def test_a_late_judge_scores_zero_counted_once_per_pair_and_never_raises(serve) -> None:  # type: ignore[no-untyped-def]
    async def hang(body: dict[str, Any], n: int) -> str:
        await asyncio.sleep(1.0)  # well past the deadline; teardown waits for it
        return "10"

    fake = await serve(hang)
    judge = judge_for(fake, timeout_s=0.2, retries=1)
    [outcome] = await judge.score(PROBLEM, ["cba"])
    assert outcome.reward == 0.0
    assert outcome.counters["judge/timeouts"] == 1  # one pair unanswered
    assert outcome.counters["judge/calls"] == 2
    assert outcome.counters["judge/retries"] == 1
    assert outcome.counters["judge/errors"] == 0
    assert outcome.counters["judge/parse_failures"] == 0
    await judge.score(PROBLEM, ["cba"])  # never answered: asked again
    assert len(fake.requests) == 4
    await judge.close()


@pytest.mark.parametrize("status", [429, 503])
async def test_a_retry_that_is_answered_counts_as_a_retry_not_an_error(serve, status: int) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: status if n == 1 else "6")
    judge = judge_for(fake, retries=1)
    [outcome] = await judge.score(PROBLEM, ["cba"])
    assert outcome.reward == pytest.approx(0.6)
    assert outcome.counters["judge/errors"] == outcome.counters["judge/timeouts"] == 0
    assert (outcome.counters["judge/calls"], outcome.counters["judge/retries"]) == (2, 1)
    await judge.close()


async def test_a_pair_every_try_of_which_failed_is_one_error(serve) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: 429)
    judge = judge_for(fake, retries=2)
    [outcome] = await judge.score(PROBLEM, ["cba"])
    assert outcome.reward == 0.0
    assert (outcome.counters["judge/errors"], outcome.counters["judge/retries"]) == (1, 2)
    await judge.close()


async def test_a_refused_request_is_not_retried_and_scores_zero(serve) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: 400)
    judge = judge_for(fake, retries=3)
    [outcome] = await judge.score(PROBLEM, ["cba"])
    assert (outcome.reward, outcome.counters["judge/errors"]) == (0.0, 1)
    assert outcome.counters["judge/retries"] == 0
    assert len(fake.requests) == 1
    await judge.close()


async def test_concurrency_is_bounded(serve) -> None:  # type: ignore[no-untyped-def]
    in_flight = peak = 0

    async def track(body: dict[str, Any], n: int) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return "1"

    fake = await serve(track)
    judge = judge_for(fake, max_concurrency=2)
    await judge.score(PROBLEM, [str(i) for i in range(8)])
    assert (len(fake.requests), peak) == (8, 2)
    await judge.close()


async def test_an_episode_is_judged_on_its_turns(serve) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: "3")
    judge = judge_for(fake, rubric="{completion}")
    await judge.score(PROBLEM, [["first", "second"]])
    assert fake.requests[0]["messages"][0]["content"] == "first\n\nsecond"
    await judge.close()


async def test_waiting_for_the_judge_fails_on_a_refused_key(serve) -> None:  # type: ignore[no-untyped-def]
    fake = await serve(lambda body, n: "1")
    good = Judge(JudgeRewardConfig(base_url=fake.url), api_key="right")
    await good.wait_ready(5)
    bad = Judge(JudgeRewardConfig(base_url=fake.url), api_key="wrong")
    with pytest.raises(ConfigError, match="401"):
        await bad.wait_ready(5)
    for judge in (good, bad):
        await judge.close()


def test_the_key_comes_from_the_environment_and_must_be_set() -> None:
    reward = {"type": "judge", "base_url": "http://127.0.0.1:1/v1", "api_key_env": "JUDGE_KEY"}
    tasks = [ReversalTaskConfig(reward=reward), ReversalTaskConfig(name="again", reward=reward)]
    built = build_model_rewards(tasks, ["reversal", "again"], environ={"JUDGE_KEY": "k"})
    assert built["reversal"] is built["again"]  # one judge (and cache) for equal configs
    assert isinstance(built["reversal"], Judge)
    assert built["reversal"].headers == {"Authorization": "Bearer k"}
    with pytest.raises(ConfigError, match="JUDGE_KEY"):
        build_model_rewards(tasks, ["reversal", "again"], environ={})


def test_a_judge_served_by_the_launcher_needs_its_url_when_run_alone() -> None:
    task = ReversalTaskConfig(reward={"type": "judge", "model_path": "/models/judge"})
    with pytest.raises(ConfigError, match="base_url"):
        build_model_rewards([task], ["reversal"], environ={})


def test_the_reward_section_validates_with_the_task() -> None:
    task = ReversalTaskConfig.model_validate(
        json.loads('{"reward": {"type": "judge", "base_url": "http://h/v1", "score": "verdict"}}')
    )
    assert isinstance(task.reward, JudgeRewardConfig)
    assert task.reward.score == "verdict"
