"""Part of `bench/inference.py`: what automatic prefix caching buys the native engine's
paged KV cache (not a benchmark of its own; `run_all.py` skips it).

One small random Llama (dim 256, 4 layers, context 1024) served by the native engine,
fp32 on the configured threads, with and without prefix caching, in two scenarios;
systems alternate in an order that rotates every round, medians:

- `grpo`: one 768-token prompt, n = 8 samples, 4 new tokens, sent twice (two "steps"
  of the same prompt, as GRPO groups sharing a system prompt): the second group's time
  (the group's samples share one prefill either way).
- `multiturn`: a 3-turn episode, each turn adding 256 tokens to the conversation and
  generating 8 (a tool call's worth; prefill-dominated, where reuse matters): the
  latency of the last turn.

A first, untimed round warms every system up. Memory: bytes of keys and values one
cached token takes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from tidal.inference.kv_cache import block_bytes
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM

ARGS = DecoderArgs(
    vocab_size=4096, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=768, max_seq_len=1024
)
BLOCK = 16


async def serving(state: dict[str, torch.Tensor], *, prefix_caching: bool) -> NativeEngine:
    engine = NativeEngine(
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_batch_size=32,
        max_queue=64,
        max_step_tokens=4096,
        kv_cache_mb=256.0,
        block_size=BLOCK,
        prefix_caching=prefix_caching,
    )
    await engine.start()
    await engine.update_weights(0, ARGS.to_hf_config(), state)
    return engine


async def collect(engine: NativeEngine, prompt: list[int], params: SamplingParams) -> int:
    return sum([len(c.token_ids) async for c in engine.generate(prompt, params)])


async def grpo_seconds(engine: NativeEngine, prompt: list[int]) -> float:
    """Seconds of the second group on the same prompt (the first warms the cache)."""
    params = SamplingParams(max_tokens=4, temperature=1.0, n=8, seed=1)
    await collect(engine, prompt, params)
    started = time.perf_counter()
    await collect(engine, prompt, params)
    return time.perf_counter() - started


async def last_turn_seconds(engine: NativeEngine, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    conversation: list[int] = []
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=seed)
    elapsed = 0.0
    for _ in range(3):
        conversation += torch.randint(0, ARGS.vocab_size, (256,), generator=g).tolist()
        started = time.perf_counter()
        (completion,) = [c async for c in engine.generate(conversation, params)]
        elapsed = time.perf_counter() - started
        conversation += completion.token_ids
    return elapsed


async def measure_kv(repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    torch.manual_seed(0)
    model = DecoderLM(ARGS)
    model.init_weights(std=0.02)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    prompt = torch.randint(0, ARGS.vocab_size, (768,)).tolist()
    samples: dict[str, list[float]] = {}
    for r in range(-1, repeats):  # round -1 warms up (oneDNN primitives, allocator); untimed
        systems = [("prefix_cache", True), ("no_prefix_cache", False)]
        shift = r % len(systems)  # rotate the order: no system always runs first or last
        for name, caching in systems[shift:] + systems[:shift]:
            engine = await serving(state, prefix_caching=caching)
            bucket: dict[str, list[float]] = samples if r >= 0 else {}
            try:
                bucket.setdefault(f"{name}.grpo_group_s", []).append(
                    await grpo_seconds(engine, prompt)
                )
                bucket.setdefault(f"{name}.multiturn_last_turn_s", []).append(
                    await last_turn_seconds(engine, seed=r)
                )
            finally:
                await engine.close()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    rows = [{"measure": k, "median": round(v, 4)} for k, v in medians.items()]
    summary = {
        "prefix_cache_speedup_grpo": medians["no_prefix_cache.grpo_group_s"]
        / medians["prefix_cache.grpo_group_s"],
        "prefix_cache_speedup_multiturn": medians["no_prefix_cache.multiturn_last_turn_s"]
        / medians["prefix_cache.multiturn_last_turn_s"],
        "kv_bytes_per_token": block_bytes(ARGS, torch.float32, BLOCK) / BLOCK,
    }
    summary["model"] = {k: v for k, v in ARGS.as_dict().items()}
    summary["block_size"] = BLOCK
    return rows, summary
