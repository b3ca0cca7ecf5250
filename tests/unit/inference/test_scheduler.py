"""The engine's scheduling over the paged KV cache gives the tokens and logprobs of a full
recomputation, with memory that follows the tokens held, prefix reuse across requests,
chunked prefill and preemption.

The tiny peaked model of conftest.py (fp32): batch composition and float rounding cannot
flip a token, so tokens compare exactly and logprobs closely.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidal.inference.block_manager import blocks_for
from tidal.inference.engine import Completion
from tidal.inference.kv_cache import block_bytes
from tidal.inference.sampling import SamplingParams

PROMPTS = [[1, 2, 3], [5, 9, 13, 17, 21, 25, 29], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]
GREEDY = SamplingParams(max_tokens=14, temperature=0.0, n=2)
SAMPLED = SamplingParams(max_tokens=14, temperature=1.0, top_p=0.9, min_p=0.01, n=3, seed=21)
BLOCK = 4


def seeded(params: SamplingParams, i: int) -> SamplingParams:
    """The parameters of the i-th prompt: its own seed offset."""
    return replace(params, seed=None if params.seed is None else params.seed + i)


async def run_all(engine: Any, tiny: Any, params: SamplingParams) -> list[list[Completion]]:
    """Every prompt of PROMPTS at once (each with its own seed offset)."""
    jobs = [tiny.collect(engine, p, seeded(params, i)) for i, p in enumerate(PROMPTS)]
    return list(await asyncio.gather(*jobs))


def reference_all(tiny: Any, params: SamplingParams) -> list[list[Completion]]:
    """What `run_all` must give: every completion from full recomputations, no cache."""
    model = tiny.model(0)
    return [tiny.reference_completions(model, p, seeded(params, i)) for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
async def test_the_cache_gives_the_tokens_and_logprobs_of_a_full_recomputation(
    tiny: Any, params: SamplingParams
) -> None:
    expected = reference_all(tiny, params)
    async with tiny.serving(0, block_size=BLOCK) as engine:
        got = await run_all(engine, tiny, params)
    for a, b in zip(expected, got, strict=True):
        tiny.assert_same(a, b)


async def test_a_prefix_cache_hit_gives_what_a_miss_gives(tiny: Any) -> None:
    async with tiny.serving(0, block_size=BLOCK) as engine:
        miss = await tiny.collect(engine, PROMPTS[2], SAMPLED)
        hits_before = engine.block_counts.prefix_hits
        hit = await tiny.collect(engine, PROMPTS[2], SAMPLED)
        assert engine.block_counts.prefix_hits - hits_before == (len(PROMPTS[2]) - 1) // BLOCK
    tiny.assert_same(miss, hit)


async def test_a_multi_turn_episode_reuses_the_previous_turns_blocks(tiny: Any) -> None:
    turn = SamplingParams(max_tokens=10, temperature=0.0)
    async with tiny.serving(0, block_size=BLOCK) as engine:
        (first,) = await tiny.collect(engine, PROMPTS[1], turn)
        second_prompt = PROMPTS[1] + first.token_ids + [7, 8]
        hits_before = engine.block_counts.prefix_hits
        (second,) = await tiny.collect(engine, second_prompt, turn)
        # Every full block of turn 1 (prompt and completion but its last, unfed token) is reused.
        reused = engine.block_counts.prefix_hits - hits_before
        assert reused == (len(PROMPTS[1]) + len(first.token_ids) - 1) // BLOCK
    (fresh,) = tiny.reference_completions(tiny.model(0), second_prompt, turn)
    tiny.assert_same([second], [fresh])


async def test_preemption_under_a_tiny_block_budget_finishes_every_request_correctly(
    tiny: Any,
) -> None:
    long = SamplingParams(max_tokens=30, temperature=1.0, top_k=8, n=3, seed=4)
    # Room for one full-context sequence and a little more: many must be preempted.
    budget_mb = (
        (blocks_for(tiny.args.max_seq_len, BLOCK) + 2)
        * block_bytes(tiny.args, torch.float32, BLOCK)
        / 2**20
    )
    expected = reference_all(tiny, long)
    async with tiny.serving(0, block_size=BLOCK, kv_cache_mb=budget_mb) as engine:
        got = await run_all(engine, tiny, long)
        assert engine.preemptions > 0
        assert engine.block_counts.held == 0  # everything released at the end
    for a, b in zip(expected, got, strict=True):
        tiny.assert_same(a, b)


async def test_chunked_prefill_gives_the_tokens_of_a_whole_prefill(tiny: Any) -> None:
    expected = reference_all(tiny, SAMPLED)
    async with tiny.serving(0, block_size=BLOCK, max_step_tokens=3) as engine:
        got = await run_all(engine, tiny, SAMPLED)
    for a, b in zip(expected, got, strict=True):
        tiny.assert_same(a, b)


async def test_blocks_held_follow_the_tokens_held(tiny: Any) -> None:
    params = SamplingParams(max_tokens=20, temperature=0.0)
    async with tiny.serving(0, block_size=BLOCK) as engine:
        seen = 0
        async for piece in engine.generate(PROMPTS[0], params, stream=True):
            seen += len(piece.token_ids)
            if piece.finish_reason is not None:
                break  # finished: its blocks are released
            held = engine.block_counts.held
            # The sequence holds its prompt and completion so far (the scheduler may be
            # one step ahead of this reader), never a full-context reservation.
            assert blocks_for(len(PROMPTS[0]) + seen - 1, BLOCK) <= held
            assert held <= blocks_for(len(PROMPTS[0]) + seen + 2, BLOCK)
        assert engine.block_counts.held == 0
        # Its full blocks stay cached for reuse: prompt and completion but the last token.
        assert engine.block_counts.cached == (len(PROMPTS[0]) + seen - 1) // BLOCK


async def test_group_samples_share_their_prompts_blocks_without_copies(tiny: Any) -> None:
    prompt = [(7 * i) % 64 for i in range(40)]  # 10 full blocks
    params = SamplingParams(max_tokens=2, temperature=1.0, n=2, seed=3)
    # Room for one full-context sequence (12 blocks): two copies of the prompt would not fit.
    budget_mb = (
        blocks_for(tiny.args.max_seq_len, BLOCK)
        * block_bytes(tiny.args, torch.float32, BLOCK)
        / 2**20
    )
    expected = tiny.reference_completions(tiny.model(0), prompt, params)
    async with tiny.serving(0, block_size=BLOCK, kv_cache_mb=budget_mb) as engine:
        got = await tiny.collect(engine, prompt, params)
        # Both samples ran on one prefill of the prompt: neither computed nor looked it up again.
        assert engine.block_counts.prefix_hits == 0
        assert engine.preemptions == 0
    tiny.assert_same(expected, got)


async def test_without_prefix_caching_every_prompt_is_computed(tiny: Any) -> None:
    async with tiny.serving(0, block_size=BLOCK, prefix_caching=False) as engine:
        first = await tiny.collect(engine, PROMPTS[2], SAMPLED)
        again = await tiny.collect(engine, PROMPTS[2], SAMPLED)
        assert engine.block_counts.prefix_hits == 0
        assert engine.block_counts.cached == 0
    tiny.assert_same(first, again)


async def test_max_model_len_caps_prompt_plus_completion(tiny: Any) -> None:
    params = SamplingParams(max_tokens=30, temperature=0.0)
    async with tiny.serving(0, block_size=BLOCK, max_model_len=16) as engine:
        (completion,) = await tiny.collect(engine, PROMPTS[2], params)
        assert engine.status().max_seq_len == 16  # the context served, what callers validate on
    assert len(PROMPTS[2]) + len(completion.token_ids) == 16
    assert completion.finish_reason == "length"


async def test_a_budget_below_one_full_sequence_is_refused_naming_the_sizes(tiny: Any) -> None:
    engine = tiny.make_engine(block_size=BLOCK, kv_cache_mb=0.001)
    await engine.start()
    try:
        with pytest.raises(ValueError, match="max_model_len = 48 needs 12"):
            await engine.update_weights(0, tiny.args.to_hf_config(), tiny.published(0))
    finally:
        await engine.close()


async def test_new_weights_clear_the_prefix_cache(tiny: Any) -> None:
    async with tiny.serving(0, block_size=BLOCK) as engine:
        await tiny.collect(engine, PROMPTS[2], SAMPLED)
        await engine.update_weights(1, tiny.args.to_hf_config(), tiny.published(1))
        assert engine.block_counts.cached == 0
        hits_before = engine.block_counts.prefix_hits
        after = await tiny.collect(engine, PROMPTS[2], SAMPLED)
        assert engine.block_counts.prefix_hits == hits_before  # old keys were not reused
    async with tiny.serving(1) as fresh:
        expected = await tiny.collect(fresh, PROMPTS[2], SAMPLED)
    tiny.assert_same(expected, after)


async def test_cancelled_requests_under_preemption_release_every_block(tiny: Any) -> None:
    long = SamplingParams(max_tokens=30, temperature=1.0, n=3, seed=9)
    budget_mb = (
        (blocks_for(tiny.args.max_seq_len, BLOCK) + 2)
        * block_bytes(tiny.args, torch.float32, BLOCK)
        / 2**20
    )

    async def first_piece(prompt: list[int]) -> None:
        async for _ in engine.generate(prompt, long, stream=True):
            return  # the caller goes away after one piece

    async with tiny.serving(0, block_size=BLOCK, kv_cache_mb=budget_mb) as engine:
        kept = asyncio.create_task(tiny.collect(engine, PROMPTS[1], long))
        await asyncio.gather(*(first_piece(p) for p in (PROMPTS[0], PROMPTS[2])))
        assert [len(c.token_ids) for c in await kept] == [30] * 3
        while engine.status().running:  # the cancelled ones are dropped at the next step
            await asyncio.sleep(0.01)
        assert engine.block_counts.held == 0


async def test_a_long_prompt_is_prefilled_in_chunks_within_the_step_budget(
    tiny: Any, span_exporter: InMemorySpanExporter
) -> None:
    span_exporter.clear()
    prompt = [(5 * i) % 64 for i in range(30)]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    async with tiny.serving(0, block_size=BLOCK, max_step_tokens=8) as engine:
        (chunked,) = await tiny.collect(engine, prompt, params)
    prefills = [s for s in span_exporter.get_finished_spans() if s.name == "inference.prefill"]
    assert [s.attributes["prefill.tokens"] for s in prefills] == [8, 8, 8, 6]
    (whole,) = tiny.reference_completions(tiny.model(0), prompt, params)
    tiny.assert_same([whole], [chunked])


async def test_a_sequence_running_across_new_weights_caches_no_more_blocks(tiny: Any) -> None:
    params = SamplingParams(max_tokens=30, temperature=0.0)
    async with tiny.serving(0, block_size=BLOCK) as engine:
        pieces = engine.generate(PROMPTS[0], params, stream=True)
        await anext(pieces)
        await engine.update_weights(1, tiny.args.to_hf_config(), tiny.published(1))
        rest = [p async for p in pieces]
        assert rest[-1].finish_reason == "length" and {1} <= set(rest[-1].policy_versions)
        assert engine.block_counts.cached == 0
