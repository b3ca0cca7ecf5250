"""The OpenAI-compatible endpoint, driven by the official `openai` client.

A real weight-sync publishes version 0 of the Qwen3-style folder (its own BPE tokenizer and
ChatML template), and the real inference service (`start_inference`, with
`[inference.http] enabled` on a free loopback port) serves it over gRPC and HTTP on one
loop, as `tidal inference` does. The client is `AsyncOpenAI` because the server runs on
the test's own event loop. With an API key and TLS (the run CA's inference certificate)
the same client round trips work, and the endpoint may listen beyond loopback. One `slow`
case serves the real SmolLM2-135M-Instruct imported from its GGUF (`tests/smollm2.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tidal.common.security.config import SecurityConfig
from tidal.common.security.credentials import CA_CERT, ensure_certificates
from tidal.inference.config import OpenAIHttpConfig
from tidal.text.hf_tokenizer import HFTokenizer

from ..smollm2 import IM_END, IM_START, smollm2_folder
from .test_inference_service import (
    Inference,
    eventually,
    inference_config,
    publish_folder,
    qwen3_folder,
    serving_inference,
)

__all__ = ["qwen3_folder", "smollm2_folder"]

MODEL = "tiny-qwen3"
PROMPT = "東京は"
CHAT = [{"role": "user", "content": "What is 12 + 30?"}]


KEY = "sk-tidal-test-key"


@contextlib.asynccontextmanager
async def openai_replica(
    weightsync: Any,
    tmp_path: Path,
    folder: Path,
    *,
    publish: bool = True,
    http: dict[str, Any] | None = None,
    **inference: Any,
) -> AsyncIterator[tuple[Inference, openai.AsyncOpenAI]]:
    """The service with the HTTP endpoint on; `inference` overrides `[inference]` keys and
    `http` `[inference.http]` keys. With `api_key_file` set the client sends its key;
    with `tls` it trusts the run's CA (`<run dir>/tls`, created here)."""
    config = inference_config(weightsync, tmp_path, str(folder))
    config.inference = config.inference.model_copy(update=inference)
    config.inference.http = OpenAIHttpConfig(enabled=True, served_model_name=MODEL, **(http or {}))
    api_key, trust = "unused", None
    if config.inference.http.api_key_file is not None:
        config.inference.http.api_key_file.write_text(KEY + "\n")
        api_key = KEY
    if config.inference.http.tls:
        tls_dir = tmp_path / "tls"
        ensure_certificates(tls_dir)
        config.security = SecurityConfig(mode="plaintext", tls_dir=tls_dir)
        trust = ssl.create_default_context(cafile=tls_dir / CA_CERT)
    async with serving_inference(config) as inference:
        if publish:
            await publish_folder(weightsync, folder)
            await inference.at_version(0)
        assert inference.running.http is not None
        client = openai.AsyncOpenAI(
            base_url=base_url(inference),
            api_key=api_key,
            max_retries=0,
            http_client=None if trust is None else openai.DefaultAsyncHttpxClient(verify=trust),
        )
        yield inference, client
        await client.close()


def base_url(inference: Inference) -> str:
    """The endpoint's URL as a client on this host dials it (loopback, whatever it binds)."""
    assert inference.running.http is not None
    http = inference.running.http
    return http.config.model_copy(update={"host": "127.0.0.1"}).url(http.port)


@pytest.fixture
async def client(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_replica(weightsync_server, tmp_path, qwen3_folder) as (_, c):
        yield c


@pytest.fixture
def tok(qwen3_folder: Path) -> HFTokenizer:
    return HFTokenizer.from_folder(qwen3_folder)


def extension(choice: Any) -> dict[str, list[int]]:
    """The documented `tidal` extension of a choice (the client keeps unknown fields)."""
    return choice.model_extra["tidal"]


async def test_models_lists_the_served_model(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_completion_text_logprobs_usage_and_policy_versions(
    client: openai.AsyncOpenAI, tok: HFTokenizer
) -> None:
    reply = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=10, n=2, seed=5, logprobs=0
    )
    assert [c.index for c in reply.choices] == [0, 1]
    generated = 0
    for choice in reply.choices:
        ids = extension(choice)["token_ids"]
        assert choice.text == tok.decode(ids)
        assert extension(choice)["policy_versions"] == [0] * len(ids)
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert len(choice.logprobs.token_logprobs) == len(ids)
        assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
        assert choice.finish_reason == ("stop" if ids[-1] in tok.eos_ids else "length")
        generated += len(ids)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(tok.encode(PROMPT))
    assert reply.usage.completion_tokens == generated


async def test_a_prompt_of_token_ids_is_served_as_given(
    client: openai.AsyncOpenAI, tok: HFTokenizer
) -> None:
    ids = tok.encode(PROMPT)
    by_ids = await client.completions.create(model=MODEL, prompt=ids, max_tokens=6, seed=2)
    by_text = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=2)
    assert by_ids.choices[0].text == by_text.choices[0].text


async def test_streamed_completion_chunks_join_to_the_whole_text(
    client: openai.AsyncOpenAI,
) -> None:
    args: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "n": 2, "seed": 7}
    whole = await client.completions.create(**args)
    stream = await client.completions.create(
        **args, stream=True, stream_options={"include_usage": True}
    )
    texts, ids, usage = {0: "", 1: ""}, {0: [], 1: []}, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            ids[choice.index] += extension(choice)["token_ids"]
    assert texts == {c.index: c.text for c in whole.choices}
    assert ids == {c.index: extension(c)["token_ids"] for c in whole.choices}
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens


async def test_chat_is_rendered_with_the_model_template(
    client: openai.AsyncOpenAI, tok: HFTokenizer
) -> None:
    reply = await client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=8, seed=3, logprobs=True
    )
    choice = reply.choices[0]
    ids = extension(choice)["token_ids"]
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(tok.encode_chat(CHAT, add_generation_prompt=True))
    assert choice.message.role == "assistant" and choice.message.content == tok.decode(ids)
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert all(e.logprob <= 0 and e.top_logprobs == [] for e in choice.logprobs.content)
    assert len(choice.logprobs.content) == len(ids) == len(extension(choice)["policy_versions"])


@pytest.mark.slow
async def test_the_real_model_answers_a_chat_rendered_in_its_chatml_template(
    weightsync_server: Any, tmp_path: Path, smollm2_folder: Path
) -> None:
    tok = HFTokenizer.from_folder(smollm2_folder)
    chatml = (
        f"{IM_START}system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        f"Face{IM_END}\n{IM_START}user\n{CHAT[0]['content']}{IM_END}\n{IM_START}assistant\n"
    )
    async with openai_replica(weightsync_server, tmp_path, smollm2_folder) as (_, client):
        reply = await client.chat.completions.create(
            model=MODEL, messages=CHAT, max_completion_tokens=24, temperature=0
        )
    choice = reply.choices[0]
    ids = extension(choice)["token_ids"]
    assert reply.usage is not None and reply.usage.prompt_tokens == len(tok.encode(chatml))
    assert choice.message.content == tok.decode(ids) and choice.message.content.strip()
    assert choice.finish_reason == ("stop" if ids[-1] == tok.token_to_id(IM_END) else "length")


async def test_streamed_chat_deltas_join_to_the_whole_message(client: openai.AsyncOpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_tokens": 12, "seed": 11}
    whole = await client.chat.completions.create(**args)
    stream = await client.chat.completions.create(**args, stream=True)
    content = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert content == whole.choices[0].message.content


async def test_stop_string_ends_the_text_before_it_streamed_or_not(
    client: openai.AsyncOpenAI,
) -> None:
    args: dict[str, Any] = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 24,
        "seed": 4,
        "extra_body": {"ignore_eos": True},
    }
    full = (await client.completions.create(**args)).choices[0].text
    # a stop string that first occurs after the start of the completion
    at = next(i for i in range(1, len(full)) if full.find(full[i]) == i and full[i].strip())
    stop = full[at]
    stopped = (await client.completions.create(**args, stop=[stop])).choices[0]
    stream = await client.completions.create(**args, stop=[stop], stream=True)
    streamed = "".join([c.choices[0].text async for c in stream])
    assert stopped.text == streamed == full[:at]
    assert stopped.finish_reason == "stop"
    # the engine's ids end with the token that completed the stop string
    assert len(extension(stopped)["token_ids"]) <= 24


async def test_bad_requests_get_openai_errors_naming_the_param(
    client: openai.AsyncOpenAI,
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"logprobs": 3}, "logprobs"),
        ({"stop": [""]}, "stop[0]"),
        ({"max_tokens": 100_000}, "max_tokens"),  # above the model's context
        ({"prompt": [10**9]}, "prompt[0]"),  # outside the vocabulary
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(**{"model": MODEL, "prompt": PROMPT, **fields})
        error = caught.value
        assert error.status_code == 400 and error.param == param, (fields, error.body)
        assert error.type == "invalid_request_error" and param in error.message
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=[])
    assert caught.value.param == "messages"


async def test_an_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)
    assert "gpt-4" in caught.value.message and MODEL in caught.value.message


async def test_before_the_first_weights_requests_get_503(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    replica = openai_replica(weightsync_server, tmp_path, qwen3_folder, publish=False)
    async with replica as (_, client):
        with pytest.raises(openai.InternalServerError) as caught:
            await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert caught.value.status_code == 503 and "no weights" in caught.value.message


async def test_a_full_queue_is_429_and_the_others_are_served(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    replica = openai_replica(
        weightsync_server, tmp_path, qwen3_folder, max_batch_size=1, max_queue=1
    )
    async with replica as (_, client):
        replies = await asyncio.gather(
            *[
                client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=40, extra_body={"ignore_eos": True}
                )
                for _ in range(4)
            ],
            return_exceptions=True,
        )
    refused = [r for r in replies if isinstance(r, openai.RateLimitError)]
    served = [r for r in replies if isinstance(r, openai.types.Completion)]
    assert refused and served and len(refused) + len(served) == 4, replies
    assert all(r.status_code == 429 and "max_queue" in r.message for r in refused)
    assert all(len(extension(r.choices[0])["token_ids"]) == 40 for r in served)


async def test_a_client_that_disconnects_frees_its_sequence(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    replica = openai_replica(weightsync_server, tmp_path, qwen3_folder)
    async with replica as (inference, client):
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=100, stream=True, extra_body={"ignore_eos": True}
        )
        async for _ in stream:
            break  # one chunk, then hang up
        before = await inference.status()
        await stream.close()

        async def freed() -> bool:
            return (await inference.status()).running == 0

        await eventually(freed)
        after = await inference.status()
    assert before.running == 1
    # cancelled in the engine: far fewer than the 100 tokens asked for were generated
    assert after.generated_tokens - before.generated_tokens < 50


async def post_raw(url: str, body: bytes, content_type: str) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers={"Content-Type": content_type}) as reply,
    ):
        return reply.status, json.loads(await reply.read())


async def test_a_body_nested_100000_deep_or_in_an_unknown_charset_is_a_4xx(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    replica = openai_replica(weightsync_server, tmp_path, qwen3_folder, publish=False)
    async with replica as (inference, _):
        url = base_url(inference) + "/completions"
        deep = await post_raw(url, b"[" * 100_000 + b"]" * 100_000, "application/json")
        charset = await post_raw(
            url, b'{"model": "tiny-qwen3"}', "application/json; charset=x-no-such"
        )
    assert deep[0] == 400 and "nested too deeply" in deep[1]["error"]["message"]
    assert charset[0] == 415 and "x-no-such" in charset[1]["error"]["message"]
    for _, reply in (deep, charset):
        assert reply["error"]["type"] == "invalid_request_error"


async def test_with_an_api_key_requests_without_it_or_with_another_are_401(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    http = {"api_key_file": tmp_path / "openai.key"}
    replica = openai_replica(weightsync_server, tmp_path, qwen3_folder, http=http)
    async with replica as (inference, client):
        served = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        wrong = openai.AsyncOpenAI(base_url=base_url(inference), api_key="sk-other", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            await wrong.models.list()
        await wrong.close()
        async with (
            aiohttp.ClientSession() as session,
            session.get(base_url(inference) + "/models") as missing,
        ):
            missing_body = await missing.json()
        assert inference.running.http is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", inference.running.http.port)
        writer.write(  # a key that is not UTF-8, which no HTTP client library sends
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
            b"Connection: close\r\n\r\n"
        )
        not_utf8 = await reader.read()
        writer.close()
    assert extension(served.choices[0])["policy_versions"] == [0, 0]
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    assert missing.status == 401 and "Bearer" in missing_body["error"]["message"]
    assert not_utf8.startswith(b"HTTP/1.1 401 ") and b"invalid_api_key" in not_utf8


async def test_tls_serves_the_run_ca_certificate_and_a_client_without_the_ca_is_refused(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    http = {"api_key_file": tmp_path / "openai.key", "tls": True}
    replica = openai_replica(weightsync_server, tmp_path, qwen3_folder, http=http)
    async with replica as (inference, client):
        assert base_url(inference).startswith("https://127.0.0.1:")
        reply = await client.chat.completions.create(
            model=MODEL, messages=CHAT, max_completion_tokens=3
        )
        untrusting = openai.AsyncOpenAI(base_url=base_url(inference), api_key=KEY, max_retries=0)
        with pytest.raises(openai.APIConnectionError):
            await untrusting.models.list()
        await untrusting.close()
    assert len(extension(reply.choices[0])["token_ids"]) == 3


async def test_beyond_loopback_with_a_key_and_tls_it_listens_on_every_address(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    http = {"host": "0.0.0.0", "api_key_file": tmp_path / "openai.key", "tls": True}
    replica = openai_replica(weightsync_server, tmp_path, qwen3_folder, http=http)
    async with replica as (inference, client):
        assert inference.running.http is not None
        assert inference.running.http.url.startswith("https://0.0.0.0:")
        models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
