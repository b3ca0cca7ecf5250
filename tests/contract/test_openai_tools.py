"""The `openai` client's tools round trip against the real inference service (on the
test's loop, as `tidal inference` runs it; tests/integration/test_openai_tools_process.py
runs it as a process).

The served model is fitted to one tool-using conversation (tests/helpers/
tool_calling_model.py), so greedy decoding writes a `<call>` and, given its result, an
answer; the endpoint (real weight-sync, real inference service, the byte tokenizer's own
`<call>` parser chosen by "auto") must turn the call into OpenAI's `tool_calls`, take the
result back as a `tool` message and serve the answer, streamed and not. Exact texts of
every other shape are in tests/unit/inference/test_tool_call_stream.py. However many or
large the tools a body offers, it is refused in well under a second, and checking valid
schemas never holds the event loop: gRPC health answers meanwhile within 100 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tidal.inference.config import OpenAIHttpConfig

from ..helpers.tool_calling_model import (
    ANSWER,
    ARGUMENTS,
    ASK,
    MODEL,
    RESULT,
    TOOLS,
    publish_trained,
)
from .test_inference_service import Inference, inference_config, serving_inference


@contextlib.asynccontextmanager
async def tool_replica(weightsync: Any, tmp_path: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    """The inference service (byte tokenizer) serving the trained weights over HTTP."""
    config = inference_config(weightsync, tmp_path, "auto")
    config.inference.http = OpenAIHttpConfig(enabled=True, served_model_name=MODEL)
    async with serving_inference(config) as inference:
        await publish_trained(weightsync)
        await inference.at_version(0)
        assert inference.running.http is not None
        http = inference.running.http
        url = http.config.url(http.port)
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as oai:
            yield oai


REQUEST: dict[str, Any] = {"model": MODEL, "tools": TOOLS, "temperature": 0.0, "max_tokens": 64}


def tool_message(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": RESULT}


async def test_a_tool_call_its_result_and_the_answer_round_trip(
    weightsync_server: Any, tmp_path: Path
) -> None:
    async with tool_replica(weightsync_server, tmp_path) as client:
        first = (await client.chat.completions.create(messages=[ASK], **REQUEST)).choices[0]
        assert first.finish_reason == "tool_calls"
        assert first.message.content is None
        assert first.message.tool_calls is not None and len(first.message.tool_calls) == 1
        call = first.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "lookup"
        assert json.loads(call.function.arguments) == ARGUMENTS
        # the client's own message object goes back, as OpenAI's examples do
        chat = [ASK, first.message, tool_message(call.id)]
        final = (await client.chat.completions.create(messages=chat, **REQUEST)).choices[0]
        assert final.finish_reason == "stop"
        assert final.message.content == ANSWER and final.message.tool_calls is None


async def test_streamed_deltas_carry_the_call_and_then_the_answer(
    weightsync_server: Any, tmp_path: Path
) -> None:
    async with tool_replica(weightsync_server, tmp_path) as client:
        stream = await client.chat.completions.create(messages=[ASK], stream=True, **REQUEST)
        content, calls, finish = "", {}, None
        async for chunk in stream:
            (choice,) = chunk.choices
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:  # the first delta of a call names it
                    assert delta.id and delta.function and delta.function.name
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "args": ""}
                assert delta.function is not None
                calls[delta.index]["args"] += delta.function.arguments or ""
        assert (content, finish, list(calls)) == ("", "tool_calls", [0])
        assert calls[0]["name"] == "lookup" and json.loads(calls[0]["args"]) == ARGUMENTS
        call = {
            "id": calls[0]["id"],
            "type": "function",
            "function": {"name": "lookup", "arguments": calls[0]["args"]},
        }
        chat = [ASK, {"role": "assistant", "tool_calls": [call]}, tool_message(calls[0]["id"])]
        stream = await client.chat.completions.create(messages=chat, stream=True, **REQUEST)
        pieces = [c.choices[0].delta async for c in stream]
        assert "".join(p.content or "" for p in pieces) == ANSWER
        assert not any(p.tool_calls for p in pieces) and len(pieces) > 1


async def test_the_clients_stream_helper_accumulates_the_message(
    weightsync_server: Any, tmp_path: Path
) -> None:
    async with tool_replica(weightsync_server, tmp_path) as client:
        async with client.chat.completions.stream(messages=[ASK], **REQUEST) as stream:
            final = (await stream.get_final_completion()).choices[0]
        assert final.finish_reason == "tool_calls"
        assert final.message.role == "assistant" and final.message.content is None
        (call,) = final.message.tool_calls or []
        assert call.function.name == "lookup" and call.function.parsed_arguments == ARGUMENTS


async def test_tool_choice_none_returns_the_call_text_as_content(
    weightsync_server: Any, tmp_path: Path
) -> None:
    async with tool_replica(weightsync_server, tmp_path) as client:
        reply = await client.chat.completions.create(messages=[ASK], tool_choice="none", **REQUEST)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop" and choice.message.tool_calls is None
        assert choice.message.content == '<call>lookup {"key": "alpha"}</call>'


async def test_a_tool_choice_that_forces_a_call_is_a_400_naming_it(
    weightsync_server: Any, tmp_path: Path
) -> None:
    async with tool_replica(weightsync_server, tmp_path) as client:
        for choice in ("required", {"type": "function", "function": {"name": "lookup"}}):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(messages=[ASK], tool_choice=choice, **REQUEST)
            assert caught.value.param == "tool_choice" and "tool_choice" in caught.value.message


@contextlib.asynccontextmanager
async def unloaded_replica(weightsync: Any, tmp_path: Path) -> AsyncIterator[tuple[Inference, str]]:
    """The service with its HTTP endpoint and no weights: a chat that passes every check
    of its body is a 503, after the checks this tests. (service, chat completions URL)"""
    config = inference_config(weightsync, tmp_path, "auto")
    config.inference.http = OpenAIHttpConfig(enabled=True, served_model_name=MODEL)
    async with serving_inference(config) as inference:
        assert inference.running.http is not None
        http = inference.running.http
        yield inference, http.config.url(http.port) + "/chat/completions"


async def post_timing_health(
    inference: Inference, url: str, body: bytes
) -> tuple[int, dict[str, Any], float, float]:
    """POST `body` while probing gRPC health back to back: (status, reply, the POST's
    seconds, the slowest probe's seconds). Bounded: 20 s at most."""
    slowest, done = 0.0, asyncio.Event()

    async def probe() -> None:
        nonlocal slowest
        while not done.is_set():
            started = time.perf_counter()
            await inference.serving()  # NOT_SERVING before the first weights: an answer
            slowest = max(slowest, time.perf_counter() - started)
            await asyncio.sleep(0.01)

    prober = asyncio.create_task(probe())
    started = time.perf_counter()
    try:
        async with aiohttp.ClientSession() as session:
            post = session.post(url, data=body, headers={"Content-Type": "application/json"})
            async with post as reply:
                status, answer = reply.status, await reply.json()
        elapsed = time.perf_counter() - started
    finally:
        done.set()
        await asyncio.wait_for(prober, 20)
    return status, answer, elapsed, slowest


def assert_health_answered_meanwhile(seconds: float, health: float) -> None:
    """The slowest health probe took a small share of the POST: work done on the event loop
    would hold a probe for most of it. A share, not only a fixed bound, because a loaded
    2-core runner can pause the whole process for a few tenths of a second."""
    assert health < max(0.1, seconds / 3), (seconds, health)


def chat_with(tools: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": MODEL, "messages": [ASK], "tools": tools}).encode()


async def test_a_hundred_thousand_tools_are_refused_at_once_and_health_answers_meanwhile(
    weightsync_server: Any, tmp_path: Path
) -> None:
    tools = [{"type": "function", "function": {"name": f"t{i}"}} for i in range(100_000)]
    body = chat_with(tools)
    assert len(body) > 4 << 20  # ~5 MB, within the default max_body_bytes
    async with unloaded_replica(weightsync_server, tmp_path) as (inference, url):
        status, reply, seconds, health = await asyncio.wait_for(
            post_timing_health(inference, url, body), 30
        )
    assert status == 413 and "inference.http.max_body_values" in reply["error"]["message"]
    assert seconds < 1.0, seconds
    assert_health_answered_meanwhile(seconds, health)


async def test_more_tools_than_the_limit_is_a_400_naming_it_before_any_is_checked(
    weightsync_server: Any, tmp_path: Path
) -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
    async with unloaded_replica(weightsync_server, tmp_path) as (inference, url):
        status, reply, seconds, _ = await post_timing_health(inference, url, chat_with([bad] * 129))
    assert status == 400 and reply["error"]["param"] == "tools", reply
    assert "inference.limits.max_tools" in reply["error"]["message"] and seconds < 1.0


async def test_tool_schemas_are_checked_off_the_event_loop(
    weightsync_server: Any, tmp_path: Path
) -> None:
    """Checking schemas costs time in their size: these valid ones (~150 KB, within the
    default `max_tools_bytes`) take about a second, during which health keeps answering."""
    properties = {f"p{i}": {"type": "string", "description": "d" * 20} for i in range(180)}
    tools = [
        {
            "type": "function",
            "function": {"name": f"t{i}", "parameters": {"properties": properties}},
        }
        for i in range(16)
    ]
    async with unloaded_replica(weightsync_server, tmp_path) as (inference, url):
        status, reply, seconds, health = await post_timing_health(inference, url, chat_with(tools))
    assert status == 503 and "no weights loaded yet" in reply["error"]["message"], reply
    assert_health_answered_meanwhile(seconds, health)
