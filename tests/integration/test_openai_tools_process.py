"""`tidal inference` as a process serves the `openai` client's tools round trip, streamed
and not.

The replica runs from the CLI with the OpenAI endpoint on, follows the test's weight-sync
service and loads the model fitted to one tool-using conversation
(tests/helpers/tool_calling_model.py). One run asserts the whole round trip both ways:
the call comes back as `tool_calls`, its result goes back as a `tool` message, and the
answer is served; streamed, the call arrives as `delta.tool_calls` and the answer as
content. tests/contract/test_openai_tools.py checks each step on its own.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from ..helpers.tool_calling_model import (
    ANSWER,
    ARGUMENTS,
    ASK,
    MODEL,
    RESULT,
    TOOLS,
    publish_trained,
    trained_weights,
)

REQUEST: dict[str, Any] = {"model": MODEL, "tools": TOOLS, "temperature": 0.0, "max_tokens": 64}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_replica(weightsync: Any, tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    overrides = {
        "security.mode": "plaintext",  # loopback only
        "endpoints.weightsync": weightsync.address,
        "endpoints.inference": "127.0.0.1:0",
        "run.output-dir": str(tmp_path / "outputs"),
        "inference.device": "cpu",
        "inference.http.enabled": "true",
        "inference.http.port": str(port),
        "inference.http.served-model-name": MODEL,
        "metrics.enabled": "false",
        "telemetry.traces-file": "false",
    }
    args = [arg for key, value in overrides.items() for arg in (f"--{key}", value)]
    log = (tmp_path / "inference.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "tidal.cli", "inference", *args], stdout=log, stderr=log
    )


async def loaded(client: openai.AsyncOpenAI, process: subprocess.Popen[bytes]) -> None:
    """Until the replica lists the model at policy version 0."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, "the inference process ended"
        try:
            (card,) = (await client.models.list()).data
            if card.model_extra and card.model_extra["tidal"]["policy_version"] == 0:
                return
        except openai.APIConnectionError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError("the replica never loaded version 0")


async def round_trip(client: openai.AsyncOpenAI) -> None:
    first = (await client.chat.completions.create(messages=[ASK], **REQUEST)).choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    (call,) = first.message.tool_calls or []
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == ARGUMENTS
    result = {"role": "tool", "tool_call_id": call.id, "content": RESULT}
    final = await client.chat.completions.create(messages=[ASK, first.message, result], **REQUEST)
    assert final.choices[0].message.content == ANSWER
    assert final.choices[0].finish_reason == "stop"


async def streamed_round_trip(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(messages=[ASK], stream=True, **REQUEST)
    deltas = [c.choices[0] async for c in stream]
    calls = [d for c in deltas for d in c.delta.tool_calls or []]
    assert [d.index for d in calls] == [0] and deltas[-1].finish_reason == "tool_calls"
    assert calls[0].function and calls[0].function.name == "lookup" and calls[0].id
    arguments = calls[0].function.arguments or ""
    assert json.loads(arguments) == ARGUMENTS
    call = {
        "id": calls[0].id,
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }
    chat = [
        ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": RESULT},
    ]
    stream = await client.chat.completions.create(messages=chat, stream=True, **REQUEST)
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == ANSWER


@pytest.mark.slow
async def test_tidal_inference_serves_the_tools_round_trip_streamed_and_not(
    weightsync_server: Any, tmp_path: Path
) -> None:
    trained_weights()  # fitted before the replica starts, so the two do not share the CPU
    port = free_port()
    process = start_replica(weightsync_server, tmp_path, port)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            await publish_trained(weightsync_server)
            await loaded(client, process)
            await round_trip(client)
            await streamed_round_trip(client)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
