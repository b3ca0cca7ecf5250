"""Part of `bench/inference.py`: the paged KV cache against the slot cache, and what
automatic prefix caching buys (not a benchmark of its own; `run_all.py` skips it).

One small random Llama (dim 256, 4 layers, context 1024) served by the native engine,
fp32 on the configured threads, in three scenarios; systems alternate in an order that
rotates every round, medians:

- `decode`: 16 prompts of 32-64 tokens, greedy, 64 new tokens each, as one batch: the
  tokens/s of the slot cache and of the paged cache (the cost of the block-table gather).
- `grpo`: one 768-token prompt, n = 8 samples, 4 new tokens, sent twice (two "steps"
  of the same prompt, as GRPO groups sharing a system prompt): paged with and without
  prefix caching (the group's samples share one prefill either way).
- `multiturn`: a 3-turn episode, each turn adding 256 tokens to the conversation and
  generating 8 (a tool call's worth; prefill-dominated, where reuse matters): the
  latency of the last turn with and without prefix caching.

A first, untimed round warms every system up.

Memory: bytes of keys and values one cached token takes in the paged cache, against the
bytes the slot cache reserves per sequence (the model's full context).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import torch

from tidal.inference.kv_cache import slot_bytes
from tidal.inference.native import NativeEngine
from tidal.inference.paged_engine import PagedEngine
from tidal.inference.paged_kv import block_bytes
from tidal.inference.sampling import SamplingParams
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM

ARGS = DecoderArgs(
    vocab_size=4096, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=768, max_seq_len=1024
)
BLOCK = 16


def make_engine(kind: str, *, prefix_caching: bool = True) -> NativeEngine:
    options: dict[str, Any] = dict(
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_batch_size=32,
        max_queue=64,
        max_step_tokens=4096,
        kv_cache_mb=256.0,
    )
    if kind == "slots":
        return NativeEngine(**options)
    return PagedEngine(block_size=BLOCK, prefix_caching=prefix_caching, **options)


async def serving(kind: str, state: dict[str, torch.Tensor], **kw: Any) -> NativeEngine:
    engine = make_engine(kind, **kw)
    await engine.start()
    await engine.update_weights(0, ARGS.to_hf_config(), state)
    return engine


async def collect(engine: NativeEngine, prompt: list[int], params: SamplingParams) -> int:
    return sum([len(c.token_ids) async for c in engine.generate(prompt, params)])


async def decode_rate(engine: NativeEngine) -> float:
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(0, ARGS.vocab_size, (32 + 2 * i,), generator=g).tolist() for i in range(16)
    ]
    params = SamplingParams(max_tokens=64, temperature=0.0)
    started = time.perf_counter()
    tokens = sum(await asyncio.gather(*(collect(engine, p, params) for p in prompts)))
    return tokens / (time.perf_counter() - started)


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
        systems = [
            ("slots", "slots", True),
            ("paged", "paged", True),
            ("paged_no_prefix_cache", "paged", False),
        ]
        shift = r % len(systems)  # rotate the order: no system always runs first or last
        for name, kind, caching in systems[shift:] + systems[:shift]:
            engine = await serving(
                kind, state, **({} if kind == "slots" else {"prefix_caching": caching})
            )
            bucket: dict[str, list[float]] = samples if r >= 0 else {}
            try:
                bucket.setdefault(f"{name}.decode_tokens_per_s", []).append(
                    await decode_rate(engine)
                )
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
        "decode_tokens_per_s_slots": medians["slots.decode_tokens_per_s"],
        "decode_tokens_per_s_paged": medians["paged.decode_tokens_per_s"],
        "paged_decode_speed_vs_slots": medians["paged.decode_tokens_per_s"]
        / medians["slots.decode_tokens_per_s"],
        "prefix_cache_speedup_grpo": medians["paged_no_prefix_cache.grpo_group_s"]
        / medians["paged.grpo_group_s"],
        "prefix_cache_speedup_multiturn": medians["paged_no_prefix_cache.multiturn_last_turn_s"]
        / medians["paged.multiturn_last_turn_s"],
        "kv_bytes_per_token_paged": block_bytes(ARGS, torch.float32, BLOCK) / BLOCK,
        "kv_bytes_per_sequence_slots": slot_bytes(ARGS, torch.float32),
    }
    summary["model"] = {k: v for k, v in ARGS.as_dict().items()}
    summary["block_size"] = BLOCK
    return rows, summary
