"""Continuous batching, prefix sharing, stop conditions, exact logprobs and hot reload.

The same tiny peaked model as test_engine.py (the `tiny` fixture, conftest.py), so greedy
argmaxes and inverse-CDF draws have clear margins and batch composition cannot flip a
token through float rounding.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidal.inference.block_manager import blocks_for
from tidal.inference.config import InferenceConfig
from tidal.inference.kv_cache import block_bytes
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.models.layers import token_logprobs

from ...helpers.sampled_distribution import filtered_logprobs

PROMPTS = [[1, 2, 3], [5, 9, 13, 17, 21, 25, 29], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]]


SEEDED = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, min_p=0.01, n=3, seed=21)


async def test_request_joining_a_busy_batch_gets_the_same_tokens_as_alone(
    engine: NativeEngine,
    tiny: Any,
) -> None:
    alone = await tiny.collect(engine, PROMPTS[0], SEEDED)
    busy = SamplingParams(max_tokens=40, temperature=0.9, top_k=6, n=4, seed=5)
    others = [asyncio.create_task(tiny.collect(engine, p, busy)) for p in (PROMPTS[1], [7, 8])]
    await tiny.wait_for_tokens(engine, alone[0].token_ids.__len__() * 3 + 8 * 5)
    assert engine.status().running == 8  # the batch is mid-flight when the request joins
    joined = await tiny.collect(engine, PROMPTS[0], SEEDED)
    assert not any(t.done() for t in others)  # it joined and left while they kept running
    tiny.assert_same(alone, joined)
    for task in others:
        assert [len(c.token_ids) for c in await task] == [40] * 4


async def test_prefix_sharing_gives_what_separate_prefills_give(
    engine: NativeEngine,
    span_exporter: InMemorySpanExporter,
    tiny: Any,
) -> None:
    span_exporter.clear()
    shared = await tiny.collect(engine, PROMPTS[2], SEEDED)
    (prefill,) = [s for s in span_exporter.get_finished_spans() if s.name == "inference.prefill"]
    assert prefill.attributes["prefill.prompts"] == 1
    assert prefill.attributes["prefill.sequences"] == 3
    async with tiny.serving(max_batch_size=1) as single:  # every sample prefilled on its own
        separate = await tiny.collect(single, PROMPTS[2], SEEDED)
    tiny.assert_same(shared, separate)
    assert len({tuple(c.token_ids) for c in shared}) > 1


async def test_logprobs_match_the_trainers_recomputation(engine: NativeEngine, tiny: Any) -> None:
    model = tiny.model(0)
    plain = SamplingParams(max_tokens=20, temperature=1.0, n=4, seed=8, model_logprobs=True)
    for c in await tiny.collect(engine, PROMPTS[1], plain):
        trainer = tiny.reference_logprobs(model, PROMPTS[1], c.token_ids)  # (T,)
        behaviour = torch.tensor(c.logprobs)
        kl = (behaviour - trainer).mean().abs()  # sampled-token (k1) estimate of KL
        assert kl < 1e-3
        torch.testing.assert_close(behaviour, trainer, atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(c.model_logprobs), trainer, atol=1e-4, rtol=0)
    # With temperature and filters, the logprob is under the filtered distribution; the
    # model logprob stays the trainer's.
    filtered = SamplingParams(
        max_tokens=20, temperature=0.7, top_k=8, top_p=0.9, n=2, seed=9, model_logprobs=True
    )
    for c in await tiny.collect(engine, PROMPTS[1], filtered):
        logits = tiny.reference_logits(model, PROMPTS[1], c.token_ids)  # (T, V)
        t = len(c.token_ids)
        expected = filtered_logprobs(
            logits, torch.full((t,), 0.7), torch.full((t,), 8), torch.full((t,), 0.9)
        ).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
        trainer = token_logprobs(logits, torch.tensor(c.token_ids))
        torch.testing.assert_close(torch.tensor(c.model_logprobs), trainer, atol=1e-4, rtol=0)


async def test_reload_mid_generation_loses_nothing_and_tags_versions(
    engine: NativeEngine,
    tiny: Any,
) -> None:
    params = SamplingParams(max_tokens=30, temperature=1.0, n=2, seed=4)
    greedy = SamplingParams(max_tokens=30, temperature=0.0)
    before = [asyncio.create_task(tiny.collect(engine, p, params)) for p in PROMPTS]
    greedy_task = asyncio.create_task(tiny.collect(engine, PROMPTS[0], greedy))
    await tiny.wait_for_tokens(engine, 7 * 5)
    await engine.update_weights(1, tiny.args.to_hf_config(), tiny.published(1))
    after = asyncio.create_task(tiny.collect(engine, PROMPTS[1], params))
    results = [*(await asyncio.gather(*before)), await greedy_task]
    for completions in results:
        for c in completions:
            assert len(c.token_ids) == len(c.policy_versions) == 30  # nothing cut short
            assert c.policy_versions == sorted(c.policy_versions)
            assert c.policy_versions[0] == 0 and c.policy_versions[-1] == 1  # spans the swap
    assert sum(len(r) for r in results) == 7
    (g,) = results[-1]
    old = g.policy_versions.count(0)
    assert g.token_ids[:old] == tiny.reference_greedy(tiny.model(0), PROMPTS[0], old)
    assert all(set(c.policy_versions) == {1} for c in await after)


async def test_streamed_pieces_add_up_to_the_completion(engine: NativeEngine, tiny: Any) -> None:
    whole = await tiny.collect(engine, PROMPTS[0], SEEDED)
    pieces: dict[int, list] = {0: [], 1: [], 2: []}
    async for piece in engine.generate(PROMPTS[0], SEEDED, stream=True):
        pieces[piece.index].append(piece)
    for c in whole:
        mine = pieces[c.index]
        assert len(mine) > 1 and all(p.finish_reason is None for p in mine[:-1])
        assert mine[-1].finish_reason == c.finish_reason
        assert [t for p in mine for t in p.token_ids] == c.token_ids
        assert [v for p in mine for v in p.policy_versions] == c.policy_versions


async def test_kv_cache_memory_bound_limits_running_sequences_not_service(tiny: Any) -> None:
    # Blocks of two full-context sequences: 7 + 20 tokens each, five of them cannot all fit.
    block = InferenceConfig().block_size
    two_sequences = 2 * blocks_for(tiny.args.max_seq_len, block)
    budget_mb = two_sequences * block_bytes(tiny.args, torch.float32, block) / 2**20
    async with tiny.serving(kv_cache_mb=budget_mb) as engine:
        params = SamplingParams(20, n=5, seed=2)
        task = asyncio.create_task(tiny.collect(engine, PROMPTS[1], params))
        await tiny.wait_for_tokens(engine, 4)
        status = engine.status()
        assert status.kv_slots_used == status.running <= 5
        assert 0 < status.kv_usage <= 1
        assert [len(c.token_ids) for c in await task] == [20] * 5
        assert engine.preemptions > 0  # the bound held sequences back, not the service
        assert engine.status().kv_slots_used == 0 and engine.block_counts.held == 0


async def test_kv_cache_too_small_for_one_sequence_is_refused(tiny: Any) -> None:
    with pytest.raises(ValueError, match="kv_cache_mb"):
        async with tiny.serving(kv_cache_mb=0.001):
            pass


async def test_step_token_budget_spreads_prefills_over_steps(
    span_exporter: InMemorySpanExporter,
    tiny: Any,
) -> None:
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    prompts = [PROMPTS[1], [p + 1 for p in PROMPTS[1]], [p + 2 for p in PROMPTS[1]]]
    async with tiny.serving(max_step_tokens=len(PROMPTS[1]) + 3) as tight:  # one prompt a step
        span_exporter.clear()
        budgeted = await asyncio.gather(*(tiny.collect(tight, p, params) for p in prompts))
    prefills = [s for s in span_exporter.get_finished_spans() if s.name == "inference.prefill"]
    tokens = [p.attributes["prefill.tokens"] for p in prefills]
    assert len(tokens) > 1 and max(tokens) <= len(PROMPTS[1]) + 3  # spread, within budget
    assert sum(tokens) == sum(len(p) for p in prompts)
    async with tiny.serving() as roomy:
        together = await asyncio.gather(*(tiny.collect(roomy, p, params) for p in prompts))
    assert [[c.token_ids for c in r] for r in budgeted] == [
        [c.token_ids for c in r] for r in together
    ]
