"""Scoring given tokens through the inference service: gRPC `Score` and the generate
endpoint's `prompt_logprobs` give the logprob (rank, top-k) of each given token that a
transformers forward pass over the same folder gives; bad fields are INVALID_ARGUMENT (400
over HTTP) naming the field."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import torch

from tidal.cli.ports import free_address
from tidal.inference.config import OpenAIHttpConfig
from tidal.rpc.v1 import inference_pb2 as pb

from ..hf_folders import qwen3_folder
from .test_inference_service import Inference, inference_config, serving_inference

__all__ = ["qwen3_folder"]

ATOL = 1e-4  # as the sampled-logprob parity tests (tests/unit/inference/test_engine.py)
IDS = [5, 17, 230, 41, 9, 77, 300, 12, 64, 8, 150, 33]


@contextlib.asynccontextmanager
async def scoring_replica(tmp_path: Path, folder: Path) -> AsyncIterator[tuple[Inference, str]]:
    """The folder served fixed (fp32, as transformers computes it) with the HTTP endpoint."""

    class Nowhere:
        address = free_address()

    config = inference_config(Nowhere, tmp_path, "auto")
    config.inference.model_path = folder
    config.inference.dtype = "float32"
    config.inference.http = OpenAIHttpConfig(enabled=True, served_model_name="teacher")
    async with serving_inference(config) as inference:
        assert inference.running.http is not None
        yield inference, inference.running.http.url.removesuffix("/v1")


def transformers_logprobs(folder: Path, ids: list[int]) -> torch.Tensor:
    """(T - 1, V) log-softmax of a transformers forward: row p scores token p + 1."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]  # (T - 1, V)
    return torch.log_softmax(logits.float(), dim=-1)


async def test_score_and_prompt_logprobs_equal_a_transformers_forward(
    tmp_path: Path, qwen3_folder: Path
) -> None:
    expected = transformers_logprobs(qwen3_folder, IDS)  # (T - 1, V)
    target = torch.tensor(IDS[1:])
    chosen = expected.gather(-1, target[:, None])[:, 0]  # (T - 1,)
    top = expected.topk(3, dim=-1)
    async with scoring_replica(tmp_path, qwen3_folder) as (inference, http):
        reply = await inference.stub.Score(pb.ScoreRequest(token_ids=IDS, start=4, top_k=3))
        assert reply.start == 4 and len(reply.logprobs) == len(IDS) - 4
        got = torch.tensor(list(reply.logprobs))
        torch.testing.assert_close(got, chosen[3:], atol=ATOL, rtol=0)
        assert list(reply.ranks) == ((expected > chosen[:, None]).sum(-1) + 1)[3:].tolist()
        assert list(reply.top_ids) == top.indices[3:].flatten().tolist()
        assert set(reply.policy_versions) == {0}

        body = {"token_ids": IDS, "sampling_params": {"max_tokens": 2, "prompt_logprobs": 3}}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{http}/inference/v1/generate", json=body) as answer,
        ):
            assert answer.status == 200, await answer.text()
            rows = (await answer.json())["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(IDS)
    for p, row in enumerate(rows[1:]):
        assert row[str(IDS[p + 1])]["logprob"] == pytest.approx(float(chosen[p]), abs=ATOL)
        assert [int(t) for t in list(row)[:3]] == top.indices[p].tolist()


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"token_ids": [5]}, "start"),
        ({"token_ids": IDS, "start": 0}, "start"),
        ({"token_ids": IDS, "start": len(IDS)}, "start"),
        ({"token_ids": IDS, "top_k": 21}, "top_k"),
        ({"token_ids": [5, 1 << 30]}, "token_ids[1]"),
    ],
)
async def test_bad_score_fields_are_invalid_argument_naming_the_field(
    tmp_path: Path, qwen3_folder: Path, fields: dict[str, Any], name: str
) -> None:
    async with scoring_replica(tmp_path, qwen3_folder) as (inference, http):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await inference.stub.Score(pb.ScoreRequest(**fields))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith(name)
        body = {"token_ids": IDS, "sampling_params": {"max_tokens": 2, "prompt_logprobs": 21}}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{http}/inference/v1/generate", json=body) as answer,
        ):
            assert answer.status == 400
            assert "sampling_params.prompt_logprobs" in await answer.text()
