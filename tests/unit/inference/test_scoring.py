"""Scoring given tokens in the native engine: each token's logprob (rank, top-k) equals the
trainer's one forward over the whole sequence, alone, chunked, batched with generation, and
with the context before `start` taken from the prefix cache."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import torch

from tidal.common.errors import InvalidArgument
from tidal.inference.engine import TokenScores
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams

ATOL = 1e-4  # as the sampled-logprob parity tests (test_engine.py)


def sequence(seed: int, length: int) -> list[int]:
    g = random.Random(seed)
    return [g.randrange(64) for _ in range(length)]


def assert_scores_match(tiny: Any, ids: list[int], scores: TokenScores, top_k: int) -> None:
    """Equal to the cache-free forward's log-softmax at every scored position."""
    model = tiny.model(0)
    start = scores.start
    logits = tiny.reference_logits(model, ids[:start], ids[start:])  # (N, V)
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    target = torch.tensor(ids[start:])  # (N,)
    expected = logprobs.gather(-1, target[:, None])[:, 0]  # (N,)
    torch.testing.assert_close(torch.tensor(scores.logprobs), expected, atol=ATOL, rtol=0)
    assert scores.ranks == ((logprobs > expected[:, None]).sum(-1) + 1).tolist()
    if top_k:
        top = logprobs.topk(top_k, dim=-1)
        assert scores.top_ids == top.indices.tolist()
        torch.testing.assert_close(torch.tensor(scores.top_logprobs), top.values, atol=ATOL, rtol=0)
    else:
        assert scores.top_ids == [[]] * len(target)
    assert scores.policy_versions == [0] * len(target)


@pytest.mark.parametrize("start", [1, 9])
async def test_scores_equal_one_forward_over_the_sequence(
    engine: NativeEngine, tiny: Any, start: int
) -> None:
    ids = sequence(0, 30)
    scores = await engine.score(ids, start=start, top_k=3)
    assert scores.start == start and len(scores.logprobs) == len(ids) - start
    assert_scores_match(tiny, ids, scores, top_k=3)


async def test_a_prompt_chunked_over_steps_scores_the_same(tiny: Any) -> None:
    ids = sequence(1, 40)
    async with tiny.serving(0, max_step_tokens=7) as engine:
        scores = await engine.score(ids, start=2, top_k=0)
    assert_scores_match(tiny, ids, scores, top_k=0)


async def test_scoring_batched_with_generation_gives_what_each_gives_alone(
    engine: NativeEngine, tiny: Any
) -> None:
    sequences = [sequence(seed, n) for seed, n in ((2, 12), (3, 25), (4, 40))]
    params = SamplingParams(max_tokens=8, temperature=1.0, n=3, seed=5)
    alone = await tiny.collect(engine, [1, 2, 3], params)
    results = await asyncio.gather(
        tiny.collect(engine, [1, 2, 3], params),
        *(engine.score(ids, start=3, top_k=2) for ids in sequences),
    )
    tiny.assert_same(alone, results[0])
    for ids, scores in zip(sequences, results[1:], strict=True):
        assert_scores_match(tiny, ids, scores, top_k=2)


async def test_the_context_before_start_comes_from_the_prefix_cache(
    engine: NativeEngine, tiny: Any
) -> None:
    """A group's completions after one prompt: the second scoring computes only its own
    tokens and the prompt's last (whose logits score the first completion token)."""
    block = engine.block_counts
    prompt = sequence(6, 33)  # two full blocks of 16 and one token
    first, second = prompt + sequence(7, 10), prompt + sequence(8, 12)
    assert_scores_match(tiny, first, await engine.score(first, start=33, top_k=0), top_k=0)
    hits = engine.block_counts.prefix_hits
    assert_scores_match(tiny, second, await engine.score(second, start=33, top_k=0), top_k=0)
    assert engine.block_counts.prefix_hits - hits == 2 > block.prefix_hits
    # Scoring from position 1 needs every position's logits: no block comes from the cache.
    hits = engine.block_counts.prefix_hits
    assert_scores_match(tiny, second, await engine.score(second, start=1, top_k=0), top_k=0)
    assert engine.block_counts.prefix_hits == hits


async def test_generation_can_return_its_prompt_scored(engine: NativeEngine, tiny: Any) -> None:
    prompt = sequence(9, 20)
    params = SamplingParams(max_tokens=4, temperature=0.0, n=2, prompt_logprobs=1)
    completions = await tiny.collect(engine, prompt, params)
    for c in completions:
        assert c.prompt_scores is not None and len(c.token_ids) == 4
        assert_scores_match(tiny, prompt, c.prompt_scores, top_k=1)


@pytest.mark.parametrize(
    ("length", "start", "field"), [(10, 0, "start"), (10, 10, "start"), (49, 1, "token_ids")]
)
async def test_a_start_outside_the_sequence_or_one_too_long_is_refused(
    engine: NativeEngine, length: int, start: int, field: str
) -> None:
    with pytest.raises(InvalidArgument, match=field):
        await engine.score(sequence(0, length), start=start, top_k=0)
