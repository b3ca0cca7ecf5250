"""vLLM's token-in/token-out `/inference/v1/generate` on the inference HTTP server.

The real inference service serves the Qwen3-style folder (as in test_openai_endpoint). The
`renderers` client that the `verifiers` train client calls renders a chat prompt itself and
posts its ids; the reply must be what that client parses (ids, logprobs keyed
`token_id:<id>`, finish reason) plus each token's policy version. A bad field is a 400
naming it as the body spells it (a bad prompt id by its index), a field that would change
the result but is not implemented (beam search, guided decoding) is refused, not ignored,
and the API key guards this route like the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from renderers import create_renderer
from renderers.base import load_tokenizer
from renderers.client import generate

from tidal.text.hf_tokenizer import HFTokenizer

from .test_openai_endpoint import KEY, MODEL, base_url, openai_replica, qwen3_folder

__all__ = ["qwen3_folder"]

CHAT = [{"role": "user", "content": "What is 12 + 30?"}]


async def post(
    url: str, body: dict[str, Any], *, key: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url.removesuffix("/v1") + "/inference/v1/generate", json=body, headers=headers
        ) as reply,
    ):
        return reply.status, await reply.json()


def body(**sampling: Any) -> dict[str, Any]:
    sampling_params = {"max_tokens": 6, **sampling}
    return {"model": MODEL, "token_ids": [5, 6, 7], "sampling_params": sampling_params}


async def test_the_renderers_client_generates_from_its_own_prompt_ids(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    renderer = create_renderer(load_tokenizer(str(qwen3_folder)))
    async with openai_replica(weightsync_server, tmp_path, qwen3_folder) as (_, client):
        result = await generate(
            client=client,
            renderer=renderer,
            messages=CHAT,
            model=MODEL,
            sampling_params={"max_tokens": 8, "temperature": 1.0, "seed": 3},
        )
    rendered = renderer.render(CHAT, add_generation_prompt=True).token_ids
    assert result["prompt_ids"] == rendered
    ids = result["completion_ids"]
    assert 0 < len(ids) <= 8 and len(result["completion_logprobs"]) == len(ids)
    assert all(lp <= 0 for lp in result["completion_logprobs"])
    stops = set(renderer.get_stop_token_ids())
    assert result["finish_reason"] == ("stop" if ids[-1] in stops else "length")


async def test_a_reply_carries_ids_logprobs_and_the_policy_version_of_each_token(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    tok = HFTokenizer.from_folder(qwen3_folder)
    async with openai_replica(weightsync_server, tmp_path, qwen3_folder) as (inference, _):
        status, reply = await post(
            base_url(inference), {**body(logprobs=1, n=2, seed=1), "request_id": "r-1"}
        )
        _, unset = await post(base_url(inference), {"token_ids": [5], "sampling_params": {}})
    assert status == 200 and reply["request_id"] == "r-1"
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    for choice in reply["choices"]:
        ids = choice["token_ids"]
        assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in ids]
        assert all(e["logprob"] <= 0 for e in choice["logprobs"]["content"])
        assert choice["tidal"] == {"token_ids": ids, "policy_versions": [0] * len(ids)}
        assert choice["finish_reason"] == ("stop" if ids[-1] in tok.eos_ids else "length")
    # no model named, no logprobs asked: served, and none computed into the reply
    assert unset["choices"][0]["logprobs"] is None and unset["choices"][0]["token_ids"]


async def test_bad_fields_are_400_naming_the_field(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({**body(), "token_ids": []}, "token_ids"),
        ({**body(), "token_ids": [1, -2]}, "token_ids[1]"),
        ({**body(), "token_ids": [1, 2, "x"]}, "token_ids[2]"),
        ({**body(), "token_ids": [1, 2, True]}, "token_ids[2]"),
        ({**body(), "token_ids": [10**9]}, "token_ids[0]"),  # outside the vocabulary
        ({"model": MODEL, "token_ids": [5]}, "sampling_params"),
        (body(temperature=-1.0), "sampling_params.temperature"),
        (body(max_tokens=100_000), "sampling_params.max_tokens"),
        (body(logprobs=5), "sampling_params.logprobs"),
        (body(presence_penalty=0.5), "sampling_params.presence_penalty"),
        (body(top_k=-5), "sampling_params.top_k"),
        (body(guided_json={"type": "object"}), "sampling_params.guided_json"),
        (body(use_beam_search=True), "sampling_params.use_beam_search"),
        (body(stop_token_ids=["x"]), "sampling_params.stop_token_ids"),
        ({**body(), "stream": True}, "stream"),
        ({**body(), "features": {"mm_hashes": {"image": ["h"]}}}, "features"),
        ({**body(), "priority": 3}, "priority"),
    ]
    async with openai_replica(weightsync_server, tmp_path, qwen3_folder) as (inference, _):
        replies = [(await post(base_url(inference), b), field) for b, field in cases]
        missing = await post(base_url(inference), {**body(), "model": "gpt-4"})
    for (status, reply), field in replies:
        assert status == 400 and reply["error"]["param"] == field, (field, reply)
        assert field in reply["error"]["message"]
    assert missing[0] == 404 and MODEL in missing[1]["error"]["message"]


async def test_with_an_api_key_generate_needs_it(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    http = {"api_key_file": tmp_path / "openai.key"}
    replica = openai_replica(weightsync_server, tmp_path, qwen3_folder, http=http)
    async with replica as (inference, _):
        without = await post(base_url(inference), body())
        wrong = await post(base_url(inference), body(), key="sk-other")
        served = await post(base_url(inference), body(), key=KEY)
    assert without[0] == wrong[0] == 401
    assert wrong[1]["error"]["code"] == "invalid_api_key"
    assert served[0] == 200 and served[1]["choices"][0]["tidal"]["policy_versions"]


@pytest.fixture(autouse=True)
def _no_cached_context_lengths() -> None:
    """`renderers` caches each endpoint's context length by URL; ports are reused."""
    from renderers import client

    client._max_prompt_len_cache.clear()
