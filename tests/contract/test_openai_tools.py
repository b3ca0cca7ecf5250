"""The `openai` client's tools round trip against the real inference service.

A random model writes no tool calls, so the served model is trained here first: a tiny
byte-level model fitted (plain supervised steps, a few seconds) to one conversation in the
byte template, where the assistant calls `lookup`, reads the tool's result and answers.
Greedy decoding then writes that call and that answer, and the endpoint (real weight-sync,
real inference service, the byte tokenizer's own `<call>` parser chosen by "auto") must
turn them into OpenAI's `tool_calls`, take the result back as a `tool` message and serve
the answer, streamed and not. Exact texts of every other shape are in
tests/unit/inference/test_tool_call_stream.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
import torch.nn.functional as F

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.inference.config import OpenAIHttpConfig
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM
from tidal.text.byte import ByteTokenizer
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import write_version

from .test_inference_service import inference_config, serving_inference

MODEL = "tiny-tools"
TOK = ByteTokenizer()
ARGS = DecoderArgs(
    vocab_size=264, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=256
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "the value of a key",
            "strict": True,  # what the client's stream helper asks to parse the arguments
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    }
]
ASK = {"role": "user", "content": "What is the value of alpha?"}
ARGUMENTS = {"key": "alpha"}
RESULT = "7302"
ANSWER = "The value is 7302."


def demonstration() -> tuple[list[int], list[tuple[int, int]]]:
    """The conversation's ids and the spans of the two assistant turns in them."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": ARGUMENTS}}
    turns = [
        ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": RESULT},
        {"role": "assistant", "content": ANSWER},
    ]

    def length(n: int, *, prompt: bool) -> int:
        return len(TOK.encode_chat(turns[:n], add_generation_prompt=prompt, tools=TOOLS))

    ids = TOK.encode_chat(turns, add_generation_prompt=False, tools=TOOLS)
    spans = [(length(1, prompt=True), length(2, prompt=False))]
    spans.append((length(3, prompt=True), len(ids)))
    return ids, spans


@functools.cache
def trained_weights() -> dict[str, torch.Tensor]:
    """Weights that reproduce both assistant turns greedily, with a wide margin (so bf16
    inference and a KV cache's rounding pick the same tokens)."""
    torch.manual_seed(0)
    model = DecoderLM(ARGS)
    model.init_weights(std=0.1)
    ids, spans = demonstration()
    tokens = torch.tensor([ids])  # (1, T)
    positions = torch.arange(len(ids))[None]  # (1, T)
    targets = torch.full_like(tokens, -100)
    for start, end in spans:
        targets[0, start:end] = tokens[0, start:end]
    inputs, labels = tokens[:, :-1], targets[:, 1:]  # predict token t from tokens < t
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(500):
        logits = model(inputs, positions[:, :-1])  # (1, T-1, V)
        if _margin(logits.detach()[0], labels[0]) > 4.0:
            break
        loss = F.cross_entropy(logits[0], labels[0], ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise AssertionError("the demonstration was not fitted in 500 steps")
    return {k: v.detach() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def _margin(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Smallest lead of the target logit over the best other one, at trained positions."""
    at = labels >= 0
    rows, want = logits[at], labels[at]  # (N, V), (N,)
    target = rows.gather(1, want[:, None])[:, 0]
    others = rows.scatter(1, want[:, None], float("-inf")).max(dim=1).values
    return float((target - others).min())


@contextlib.asynccontextmanager
async def tool_replica(weightsync: Any, tmp_path: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    """The inference service (byte tokenizer) serving the trained weights over HTTP."""
    config = inference_config(weightsync, tmp_path, "auto")
    config.inference.http = OpenAIHttpConfig(enabled=True, served_model_name=MODEL)
    async with serving_inference(config) as inference:
        manifest = write_version(
            weightsync.root,
            version=0,
            step=0,
            state_dict=trained_weights(),
            config=ARGS.to_hf_config(),
        )
        client = WeightSyncClient(weightsync.address, security=PLAINTEXT_LOOPBACK)
        await client.publish(manifest)
        await client.close()
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
