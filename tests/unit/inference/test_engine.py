"""The native engine with a tiny random model (dim 32), checked against a cache-free reference.

The model, its engines and the references are the `tiny` fixture (conftest.py): weights
drawn with a large std, so greedy argmaxes have clear margins and float differences
between batched and reference forwards cannot flip them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidal.common.errors import ResourceExhausted, Unavailable
from tidal.inference.decode_attention import native_decode_pays
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM

PROMPTS = [[1, 2, 3], [5, 9, 13, 17, 21, 25, 29], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]]


async def test_greedy_batch_equals_cache_free_reference(engine: NativeEngine, tiny: Any) -> None:
    params = SamplingParams(max_tokens=20, temperature=0.0)
    results = await asyncio.gather(*(tiny.collect(engine, p, params) for p in PROMPTS))
    model = tiny.model(0)
    for prompt, (completion,) in zip(PROMPTS, results, strict=True):
        assert completion.token_ids == tiny.reference_greedy(model, prompt, 20)
        assert completion.finish_reason == "length"
        expected = tiny.reference_logprobs(model, prompt, completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


async def test_sampled_logprobs_equal_recomputed_model_logprobs(
    engine: NativeEngine, tiny: Any
) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, n=4, seed=3)
    model = tiny.model(0)
    for completion in await tiny.collect(engine, PROMPTS[1], params):
        assert len(completion.token_ids) == len(completion.logprobs) == 16
        expected = tiny.reference_logprobs(model, PROMPTS[1], completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


async def test_same_seed_same_tokens_alone_and_inside_a_larger_batch(
    engine: NativeEngine,
    span_exporter: InMemorySpanExporter,
    tiny: Any,
) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, n=3, seed=11)
    alone = await tiny.collect(engine, PROMPTS[0], params)
    others = SamplingParams(max_tokens=24, temperature=0.8, top_k=5, n=5)
    span_exporter.clear()
    crowd = await asyncio.gather(
        tiny.collect(engine, PROMPTS[2], others),
        tiny.collect(engine, PROMPTS[0], params),
        tiny.collect(engine, PROMPTS[1], others),
    )
    assert [c.token_ids for c in crowd[1]] == [c.token_ids for c in alone]
    prefills = [s for s in span_exporter.get_finished_spans() if s.name == "inference.prefill"]
    assert [p.attributes["prefill.sequences"] for p in prefills] == [13]  # admitted together
    assert [p.attributes["prefill.prompts"] for p in prefills] == [3]  # one prefill per prompt
    assert len({tuple(c.token_ids) for c in alone}) > 1  # the n samples differ from each other
    other_seed = await tiny.collect(engine, PROMPTS[0], SamplingParams(16, 1.0, 0.9, n=3, seed=12))
    assert [c.token_ids for c in other_seed] != [c.token_ids for c in alone]


async def test_stop_token_ends_the_completion_and_is_kept(engine: NativeEngine, tiny: Any) -> None:
    greedy = tiny.reference_greedy(tiny.model(0), PROMPTS[0], 10)
    stop = greedy[4]
    first = greedy.index(stop)
    (completion,) = await tiny.collect(
        engine, PROMPTS[0], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(stop,))
    )
    assert completion.token_ids == greedy[: first + 1]
    assert completion.finish_reason == "stop"


async def test_generation_stops_at_the_model_context(engine: NativeEngine, tiny: Any) -> None:
    prompt = list(range(tiny.args.max_seq_len - 3))
    (completion,) = await tiny.collect(
        engine, prompt, SamplingParams(max_tokens=100, temperature=0.0)
    )
    assert len(completion.token_ids) == 3 and completion.finish_reason == "length"


async def test_weight_swap_mid_generation_tags_later_tokens_with_new_version(
    engine: NativeEngine,
    tiny: Any,
) -> None:
    params = SamplingParams(max_tokens=40, temperature=0.0)
    task = asyncio.create_task(tiny.collect(engine, PROMPTS[0], params))
    await tiny.wait_for_tokens(engine, 2)  # the batch is decoding
    await engine.update_weights(1, tiny.args.to_hf_config(), tiny.published(1))
    (completion,) = await task
    versions = completion.policy_versions
    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1
    assert engine.status().policy_version == 1
    (after,) = await tiny.collect(engine, PROMPTS[0], params)
    assert after.token_ids == tiny.reference_greedy(tiny.model(1), PROMPTS[0], 40)
    assert set(after.policy_versions) == {1}


async def test_bad_weights_are_refused_and_old_version_keeps_serving(
    engine: NativeEngine, tiny: Any
) -> None:
    state = tiny.published(1)
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        await engine.update_weights(1, tiny.args.to_hf_config(), state)
    wrong = tiny.published(1)
    wrong["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="up_proj"):
        await engine.update_weights(1, tiny.args.to_hf_config(), wrong)
    assert engine.status().policy_version == 0
    (completion,) = await tiny.collect(engine, PROMPTS[0], SamplingParams(8, temperature=0.0))
    assert completion.token_ids == tiny.reference_greedy(tiny.model(0), PROMPTS[0], 8)


async def test_requests_larger_than_a_batch_are_split(tiny: Any) -> None:
    async with tiny.serving(max_batch_size=2) as engine:
        out = await tiny.collect(engine, PROMPTS[0], SamplingParams(max_tokens=4, n=5, seed=1))
    assert [c.index for c in out] == [0, 1, 2, 3, 4]


async def test_unavailable_before_weights_and_queue_limit(tiny: Any) -> None:
    engine = tiny.make_engine(max_batch_size=1, max_queue=1)
    await engine.start()
    with pytest.raises(Unavailable):
        await anext(engine.generate([1], SamplingParams(max_tokens=1)))
    await engine.update_weights(0, tiny.args.to_hf_config(), tiny.published(0))
    long = SamplingParams(max_tokens=40, temperature=0.0)
    running = asyncio.create_task(tiny.collect(engine, [1], long))
    while engine.status().running == 0:
        await asyncio.sleep(0)
    queued = asyncio.create_task(tiny.collect(engine, [2], long))
    while engine.status().queued == 0:
        await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted):
        await anext(engine.generate([3], long))
    assert len((await running)[0].token_ids) == len((await queued)[0].token_ids) == 40
    await engine.close()


async def test_cancelled_caller_does_not_disturb_others(engine: NativeEngine, tiny: Any) -> None:
    params = SamplingParams(max_tokens=30, temperature=0.0, n=4)
    victim = asyncio.create_task(tiny.collect(engine, PROMPTS[1], params))
    survivor = asyncio.create_task(tiny.collect(engine, PROMPTS[0], params))
    await tiny.wait_for_tokens(engine, 1)
    victim.cancel()
    out = await survivor
    assert [len(c.token_ids) for c in out] == [30] * 4
    (later,) = await tiny.collect(engine, PROMPTS[2], SamplingParams(max_tokens=5, temperature=0.0))
    assert later.token_ids == tiny.reference_greedy(tiny.model(0), PROMPTS[2], 5)


async def test_packed_and_plain_linears_generate_the_same_tokens(tiny: Any) -> None:
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, n=2, seed=7)
    results = []
    for packed in (True, False):
        async with tiny.serving(packed_weights=packed) as engine:
            results.append(await tiny.collect(engine, PROMPTS[1], params))
    tiny.assert_same(results[0], results[1])


async def test_bf16_engine_serves_on_each_kernel_path_and_says_which(
    tiny: Any, bf16_path: str
) -> None:
    """Native bf16 kernels where the CPU has them; fp32 linears from bf16 weights anywhere."""
    params = SamplingParams(max_tokens=12, temperature=0.0)
    async with tiny.serving(dtype=torch.bfloat16) as engine:
        kernels = engine.status().kernels
        (completion,) = await tiny.collect(engine, PROMPTS[1], params)
    if bf16_path == "native":
        attention = "native paged" if native_decode_pays() else "sdpa"
        assert kernels == f"cpu onednn-packed bf16; decode attention {attention}"
    else:
        assert kernels.startswith("cpu onednn-packed fp32 from bf16 weights (no native bf16:")
    reference = tiny.model(0).to(torch.bfloat16)  # plain bf16 F.linear, no cache
    assert completion.token_ids == tiny.reference_greedy(reference, PROMPTS[1], 12)


async def test_status_names_the_served_family_shape_and_size(tiny: Any) -> None:
    """Tied head counted once: 2 layers of 9,280 parameters, a 64x32 embedding, a norm."""
    async with tiny.serving() as engine:
        assert engine.status().model == "llama-2x32 (vocab 64, tied, 20.6K params)"
    qwen3 = DecoderArgs(**{**tiny.args.as_dict(), "family": "qwen3", "qk_norm": True})
    torch.manual_seed(0)
    model = DecoderLM(qwen3)
    model.init_weights()
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    engine = tiny.make_engine()
    await engine.start()
    try:
        await engine.update_weights(0, qwen3.to_hf_config(), state)
        assert engine.status().model == "qwen3-2x32 (vocab 64, tied, 20.7K params)"  # + q/k norms
    finally:
        await engine.close()
