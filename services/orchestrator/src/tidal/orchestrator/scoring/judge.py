"""Rewards from an LLM judge on an OpenAI-compatible chat endpoint, on the orchestrator's loop.

Judging is I/O: requests run as asyncio tasks (at most `max_concurrency` in flight), each
under its own deadline, retried on a timeout, a refused connection or a 429/5xx. A
failure never fails the step: the pair scores 0 and is counted once, by its last try;
a try that a retry then answered is a retry, not a failure. Each request is its own task,
cached by its rendered rubric, so a pair asked again while in flight or later shares the
one request, and a cancelled asker does not cancel it for the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.model_reward_config import JudgeRewardConfig
from tidal.orchestrator.scoring.rubric import parse_score, render_rubric
from tidal.orchestrator.scoring.verifier_pool import VerifyOutcome
from tidal.orchestrator.tasks.base import Problem

log = logging.getLogger(__name__)
RETRY_BACKOFF_S = 0.5
READY_POLL_S = 0.5


class _Retryable(Exception):
    """A failure another try may not meet (a 429 or 5xx answer)."""


@dataclass(frozen=True)
class _Answer:
    """What one judged pair cost and gave: reward None when no usable score came back."""

    reward: float | None
    calls: int
    seconds: float = 0.0
    answered: bool = False
    """The judge replied (with or without a parsable score)."""
    failure: str | None = None
    """Why the pair went unanswered: "timeout" or "error" (its last try's failure)."""

    def counters(self) -> dict[str, float]:
        return {
            "judge/calls": float(self.calls),
            "judge/retries": float(max(0, self.calls - 1)),
            "judge/parse_failures": float(self.answered and self.reward is None),
            "judge/timeouts": float(self.failure == "timeout"),
            "judge/errors": float(self.failure == "error"),
            "judge/seconds": self.seconds,
        }


def completion_text(completion: str | list[str]) -> str:
    """What a judge or reward model reads: the completion, or an episode's model turns."""
    return completion if isinstance(completion, str) else "\n\n".join(completion)


class Judge:
    def __init__(self, config: JudgeRewardConfig, *, api_key: str | None = None) -> None:
        if config.base_url is None:
            raise ValueError("the judge's base_url is not set")
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._cache: OrderedDict[str, asyncio.Task[_Answer]] = OrderedDict()
        self._slots: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._logged: set[str] = set()

    async def score(
        self, problem: Problem, completions: Sequence[str | list[str]]
    ) -> list[VerifyOutcome]:
        """One outcome per completion; counters say what each cost (`judge/...`)."""
        return list(await asyncio.gather(*(self.judge(problem, c) for c in completions)))

    async def judge(self, problem: Problem, completion: str | list[str]) -> VerifyOutcome:
        content = render_rubric(
            self.config.rubric,
            prompt=problem.prompt,
            completion=completion_text(completion),
            reference=problem.reference,
            answer=problem.answer or problem.reference,
        )
        request = self._cache.get(content)
        if request is not None:
            self._cache.move_to_end(content)
            answer = await asyncio.shield(request)
            return VerifyOutcome(answer.reward or 0.0, counters={"judge/cache_hits": 1.0})
        request = asyncio.create_task(self._ask(content))
        self._remember(content, request)
        answer = await asyncio.shield(request)
        return VerifyOutcome(answer.reward or 0.0, counters=answer.counters())

    def _remember(self, content: str, request: asyncio.Task[_Answer]) -> None:
        if self.config.cache_size == 0:
            return
        self._cache[content] = request
        request.add_done_callback(lambda done: self._forget_unanswered(content, done))
        while len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)

    def _forget_unanswered(self, content: str, request: asyncio.Task[_Answer]) -> None:
        """A pair the judge never answered is asked again next time."""
        failed = request.cancelled() or request.exception() is not None
        if (failed or not request.result().answered) and self._cache.get(content) is request:
            del self._cache[content]

    async def _ask(self, content: str) -> _Answer:
        """One pair judged: up to 1 + `retries` requests, each under `timeout_s`."""
        calls = 0
        seconds = 0.0
        failure, why = "error", ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                await asyncio.sleep(RETRY_BACKOFF_S * attempt)
            async with self._limit():
                calls += 1
                started = time.monotonic()
                try:
                    reply = await asyncio.wait_for(self._post(content), self.config.timeout_s)
                except TimeoutError:
                    failure, why = "timeout", f"no answer in {self.config.timeout_s}s"
                    continue
                except (aiohttp.ClientError, _Retryable) as exc:
                    failure, why = "error", repr(exc)
                    continue
                except ValueError as exc:  # refused (4xx) or not a chat completion
                    failure, why = "error", str(exc)
                    break
                finally:
                    seconds += time.monotonic() - started
            reward = parse_score(reply, self.config)
            if reward is None:
                self._log_once("parse", f"no score in {reply[:120]!r}")
            return _Answer(reward, calls, seconds, answered=True)
        self._log_once(failure, why)
        return _Answer(None, calls, seconds, failure=failure)

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once the endpoint answers HTTP (a judge replica may still be starting);
        ConfigError when it refuses the API key, or never answers within `timeout_s`."""
        url = self.url.removesuffix("/chat/completions") + "/models"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                async with self._client().get(url) as response:
                    if response.status in (401, 403):
                        raise ConfigError(f"judge at {url}: HTTP {response.status}, key refused")
                    return
            except aiohttp.ClientError as exc:
                if time.monotonic() > deadline:
                    raise ConfigError(f"judge at {url}: no answer in {timeout_s}s: {exc}") from exc
                await asyncio.sleep(READY_POLL_S)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # a session belongs to the loop that uses it
            self._session = aiohttp.ClientSession(headers=self.headers)
        return self._session

    def _limit(self) -> asyncio.Semaphore:
        if self._slots is None:  # a semaphore belongs to the loop that uses it
            self._slots = asyncio.Semaphore(self.config.max_concurrency)
        return self._slots

    async def _post(self, content: str) -> str:
        messages = [{"role": "user", "content": content}]
        if self.config.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
        }
        async with self._client().post(self.url, json=body) as response:
            text = await response.text()
            if response.status == 429 or response.status >= 500:
                raise _Retryable(f"HTTP {response.status}: {text[:200]}")
            if response.status >= 400:
                raise ValueError(f"HTTP {response.status} from {self.url}: {text[:200]}")
        try:
            return str(_json(text)["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"not a chat completion from {self.url}: {text[:200]}") from exc

    def _log_once(self, kind: str, why: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "judge %r at %s: %s; the pair scores 0 (further %s failures are counted in "
                "judge/* metrics, not logged)",
                self.config.model,
                self.url,
                why,
                kind,
            )

    async def close(self) -> None:
        for request in self._cache.values():
            request.cancel()
        if self._session is not None:
            await self._session.close()


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
