"""The native engine with a tiny random model (dim 32), checked against a cache-free reference.

The model's weights are drawn with a large std so its distributions are peaked: greedy
argmaxes then have clear margins, and float differences between batched and reference
forwards cannot flip them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidal.common.errors import ResourceExhausted, Unavailable
from tidal.common.tokenizer import ByteTokenizer
from tidal.inference.config import InferenceConfig
from tidal.inference.engine import Completion
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.trainer.models.llama.model import LlamaArgs, LlamaForCausalLM, token_logprobs

ARGS = LlamaArgs(
    vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=48
)


def tiny_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(ARGS)
    model.init_weights(std=0.3)
    return model.eval()


def published(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """What the trainer publishes: tied head left out."""
    return {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def make_engine(**kwargs: Any) -> NativeEngine:
    defaults = InferenceConfig()
    options = {
        "max_batch_size": 128,
        "max_queue": 64,
        "max_step_tokens": defaults.max_step_tokens,
        "kv_cache_mb": defaults.kv_cache_mb,
        "detokenize": ByteTokenizer().decode,
        **kwargs,
    }
    return NativeEngine(device=torch.device("cpu"), dtype=torch.float32, seed=0, **options)


@pytest.fixture
async def engine() -> AsyncIterator[NativeEngine]:
    e = make_engine()
    await e.start()
    await e.update_weights(0, ARGS.to_hf_config(), published(tiny_model(0)))
    yield e
    await e.close()


async def collect(
    engine: NativeEngine, prompt: list[int], params: SamplingParams
) -> list[Completion]:
    out = [c async for c in engine.generate(prompt, params)]
    return sorted(out, key=lambda c: c.index)


@torch.no_grad()
def reference_greedy(model: LlamaForCausalLM, prompt: list[int], steps: int) -> list[int]:
    """Recompute the whole sequence each step, no cache, no padding."""
    ids = list(prompt)
    for _ in range(steps):
        x = torch.tensor([ids])
        logits = model(x, torch.arange(len(ids))[None])  # (1, T, V)
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


@torch.no_grad()
def reference_logprobs(
    model: LlamaForCausalLM, prompt: list[int], tokens: list[int]
) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    logits = model(ids, torch.arange(ids.shape[1])[None])  # (1, T, V)
    return token_logprobs(logits[0, len(prompt) - 1 : -1], torch.tensor(tokens))


PROMPTS = [[1, 2, 3], [5, 9, 13, 17, 21, 25, 29], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]]


async def test_greedy_batch_equals_cache_free_reference(engine: NativeEngine) -> None:
    params = SamplingParams(max_tokens=20, temperature=0.0)
    results = await asyncio.gather(*(collect(engine, p, params) for p in PROMPTS))
    model = tiny_model(0)
    for prompt, (completion,) in zip(PROMPTS, results, strict=True):
        assert completion.token_ids == reference_greedy(model, prompt, 20)
        assert completion.finish_reason == "length"
        expected = reference_logprobs(model, prompt, completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


async def test_sampled_logprobs_equal_recomputed_model_logprobs(engine: NativeEngine) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, n=4, seed=3)
    model = tiny_model(0)
    for completion in await collect(engine, PROMPTS[1], params):
        assert len(completion.token_ids) == len(completion.logprobs) == 16
        expected = reference_logprobs(model, PROMPTS[1], completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


async def test_same_seed_same_tokens_alone_and_inside_a_larger_batch(
    engine: NativeEngine, span_exporter: InMemorySpanExporter
) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, n=3, seed=11)
    alone = await collect(engine, PROMPTS[0], params)
    others = SamplingParams(max_tokens=24, temperature=0.8, top_k=5, n=5)
    span_exporter.clear()
    crowd = await asyncio.gather(
        collect(engine, PROMPTS[2], others),
        collect(engine, PROMPTS[0], params),
        collect(engine, PROMPTS[1], others),
    )
    assert [c.token_ids for c in crowd[1]] == [c.token_ids for c in alone]
    prefills = [s for s in span_exporter.get_finished_spans() if s.name == "inference.prefill"]
    assert [p.attributes["prefill.sequences"] for p in prefills] == [13]  # admitted together
    assert [p.attributes["prefill.prompts"] for p in prefills] == [3]  # one prefill per prompt
    assert len({tuple(c.token_ids) for c in alone}) > 1  # the n samples differ from each other
    other_seed = await collect(engine, PROMPTS[0], SamplingParams(16, 1.0, 0.9, n=3, seed=12))
    assert [c.token_ids for c in other_seed] != [c.token_ids for c in alone]


async def test_stop_token_ends_the_completion_and_is_kept(engine: NativeEngine) -> None:
    greedy = reference_greedy(tiny_model(0), PROMPTS[0], 10)
    stop = greedy[4]
    first = greedy.index(stop)
    (completion,) = await collect(
        engine, PROMPTS[0], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(stop,))
    )
    assert completion.token_ids == greedy[: first + 1]
    assert completion.finish_reason == "stop"


async def test_generation_stops_at_the_model_context(engine: NativeEngine) -> None:
    prompt = list(range(ARGS.max_seq_len - 3))
    (completion,) = await collect(engine, prompt, SamplingParams(max_tokens=100, temperature=0.0))
    assert len(completion.token_ids) == 3 and completion.finish_reason == "length"


async def test_weight_swap_mid_generation_tags_later_tokens_with_new_version(
    engine: NativeEngine,
) -> None:
    params = SamplingParams(max_tokens=40, temperature=0.0)
    task = asyncio.create_task(collect(engine, PROMPTS[0], params))
    while engine.status().generated_tokens < 2:  # the batch is decoding
        await asyncio.sleep(0)
    await engine.update_weights(1, ARGS.to_hf_config(), published(tiny_model(1)))
    (completion,) = await task
    versions = completion.policy_versions
    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1
    assert engine.status().policy_version == 1
    (after,) = await collect(engine, PROMPTS[0], params)
    assert after.token_ids == reference_greedy(tiny_model(1), PROMPTS[0], 40)
    assert set(after.policy_versions) == {1}


async def test_bad_weights_are_refused_and_old_version_keeps_serving(engine: NativeEngine) -> None:
    state = published(tiny_model(1))
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        await engine.update_weights(1, ARGS.to_hf_config(), state)
    wrong = published(tiny_model(1))
    wrong["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="up_proj"):
        await engine.update_weights(1, ARGS.to_hf_config(), wrong)
    assert engine.status().policy_version == 0
    (completion,) = await collect(engine, PROMPTS[0], SamplingParams(8, temperature=0.0))
    assert completion.token_ids == reference_greedy(tiny_model(0), PROMPTS[0], 8)


async def test_requests_larger_than_a_batch_are_split() -> None:
    engine = make_engine(max_batch_size=2)
    await engine.start()
    await engine.update_weights(0, ARGS.to_hf_config(), published(tiny_model(0)))
    out = await collect(engine, PROMPTS[0], SamplingParams(max_tokens=4, n=5, seed=1))
    assert [c.index for c in out] == [0, 1, 2, 3, 4]
    await engine.close()


async def test_unavailable_before_weights_and_queue_limit() -> None:
    engine = make_engine(max_batch_size=1, max_queue=1)
    await engine.start()
    with pytest.raises(Unavailable):
        await anext(engine.generate([1], SamplingParams(max_tokens=1)))
    await engine.update_weights(0, ARGS.to_hf_config(), published(tiny_model(0)))
    long = SamplingParams(max_tokens=40, temperature=0.0)
    running = asyncio.create_task(collect(engine, [1], long))
    while engine.status().running == 0:
        await asyncio.sleep(0)
    queued = asyncio.create_task(collect(engine, [2], long))
    while engine.status().queued == 0:
        await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted):
        await anext(engine.generate([3], long))
    assert len((await running)[0].token_ids) == len((await queued)[0].token_ids) == 40
    await engine.close()


async def test_cancelled_caller_does_not_disturb_others(engine: NativeEngine) -> None:
    params = SamplingParams(max_tokens=30, temperature=0.0, n=4)
    victim = asyncio.create_task(collect(engine, PROMPTS[1], params))
    survivor = asyncio.create_task(collect(engine, PROMPTS[0], params))
    while engine.status().generated_tokens == 0:
        await asyncio.sleep(0)
    victim.cancel()
    out = await survivor
    assert [len(c.token_ids) for c in out] == [30] * 4
    (later,) = await collect(engine, PROMPTS[2], SamplingParams(max_tokens=5, temperature=0.0))
    assert later.token_ids == reference_greedy(tiny_model(0), PROMPTS[2], 5)
