"""Part of `bench/inference.py` (`run_all.py` skips it): the native engine's decode step at
the RL rollout shape, and how much of it is the model's forward.

The shape is `rl_step.py`'s small one: a ~4.2M-parameter Qwen2 (dim 256, 4 layers, MLP
1024, byte vocabulary), 8 prompts x n = 8 = 64 sequences, 8 new tokens, temperature 1,
fp32, at the inference service's default thread count. Medians over rounds:
`round_ms_per_step`, a 64-sequence round through `generate` (scheduling, prefill, 7
decodes, delivery) over its 8 steps; `decode_step_ms` and `forward_ms`, one
`Batcher.decode` and the model forward alone on inputs built beforehand, interleaved;
their difference, `outside_forward_ms`, is inputs, block tables, mask, sampling and
bookkeeping. `python bench/inference_step.py [--rounds N]` runs it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch

from tidal.inference.batching import Batcher
from tidal.inference.config import InferenceConfig
from tidal.inference.decode_attention import choose_decode_attention
from tidal.inference.native import NativeEngine
from tidal.inference.packed_linear import choose_linear_kernel
from tidal.inference.sampling import SamplingParams
from tidal.inference.scheduler import Extend
from tidal.inference.sequence import Request, Sequence
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM
from tidal.text.byte import ByteTokenizer

ARGS = DecoderArgs(
    family="qwen2", vocab_size=264, dim=256, n_layers=4, n_heads=4, n_kv_heads=4,
    ffn_dim=1024, max_seq_len=128, attention_bias=True,
)  # fmt: skip
PROMPTS, N, NEW_TOKENS = 8, 8, 8


def build_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = DecoderLM(ARGS)
    model.init_weights()
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}


def prompts(tokenizer: ByteTokenizer) -> list[list[int]]:
    """Reversal-task-like prompts of 13 bytes and a BOS."""
    return [tokenizer.encode("reverse: " + "abcdefgh"[i % 4 : i % 4 + 4]) for i in range(PROMPTS)]


async def round_ms_per_step(state: dict[str, torch.Tensor], rounds: int) -> float:
    """Median wall ms per step of 64-sequence rounds through `NativeEngine.generate`."""
    tokenizer = ByteTokenizer()
    engine = NativeEngine(
        device=torch.device("cpu"), dtype=torch.float32, max_batch_size=PROMPTS * N,
        max_queue=1024, max_step_tokens=2048, kv_cache_mb=64.0, tokenizer=tokenizer,
    )  # fmt: skip
    await engine.start()
    await engine.update_weights(0, ARGS.to_hf_config(), state)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, n=N, seed=1)

    async def one(prompt: list[int]) -> None:
        async for _ in engine.generate(prompt, params):
            pass

    times = []
    for i in range(rounds + 2):  # two warm-up rounds
        started = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts(tokenizer)))
        if i >= 2:
            times.append((time.perf_counter() - started) / NEW_TOKENS)
    await engine.close()
    return 1000 * statistics.median(times)


def step_split(state: dict[str, torch.Tensor], rounds: int) -> tuple[float, float]:
    """Median ms of a 64-sequence `Batcher.decode` and of the forward alone, interleaved."""
    tokenizer = ByteTokenizer()
    cpu = torch.device("cpu")
    compile_default = InferenceConfig().compile_attention  # the engine's own attention
    batcher = Batcher.build(
        ARGS.to_hf_config(), state, device=cpu, dtype=torch.float32,
        kernel=choose_linear_kernel(cpu, torch.float32, packed=True), batch_hint=PROMPTS * N,
        block_size=16, prefix_caching=True, memory_mb=64.0, memory_fraction=None,
        max_model_len=None,
        decode_kernel=choose_decode_attention(cpu, compile_attention=compile_default),
    )  # fmt: skip
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, n=N, seed=1)
    cache = batcher.cache
    steps: list[float] = []
    forwards: list[float] = []
    for _ in range(rounds + 2):
        sequences = []
        for g, prompt in enumerate(prompts(tokenizer)):
            request = Request(prompt, params, g, None, False)  # type: ignore[arg-type]
            for i in range(N):
                s = Sequence.start(request, i, NEW_TOKENS, tokenizer)
                s.blocks = [cache.blocks.allocate() for _ in range(2)]
                sequences.append(s)
        batcher.extend([Extend(s, 0, len(s.prompt_ids), sample=True) for s in sequences], 0)
        for _ in range(NEW_TOKENS - 1):
            inputs = torch.tensor([[s.token_ids[-1]] for s in sequences])
            attention = cache.decode([s.blocks for s in sequences], [s.position for s in sequences])
            started = time.perf_counter()
            with torch.inference_mode():
                batcher.model(inputs, attention.reads.positions[:, None], attention=attention)
            forwards.append(time.perf_counter() - started)
            started = time.perf_counter()
            batcher.decode(sequences, 0)
            steps.append(time.perf_counter() - started)
        for s in sequences:
            cache.blocks.release(s.blocks)
    return 1000 * statistics.median(steps), 1000 * statistics.median(forwards)


def measure_step(rounds: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(table rows, summary figures) of the RL-shape decode step."""
    state = build_state()
    previous = torch.get_num_threads()
    torch.set_num_threads(InferenceConfig().num_threads)  # the service's own thread count
    try:
        round_ms = asyncio.run(round_ms_per_step(state, rounds))
        step_ms, forward_ms = step_split(state, rounds)
    finally:
        torch.set_num_threads(previous)
    summary = {
        "round_ms_per_step": round(round_ms, 2),
        "decode_step_ms": round(step_ms, 2),
        "forward_ms": round(forward_ms, 2),
        "outside_forward_ms": round(step_ms - forward_ms, 2),
    }
    rows = [{"measure": k, "ms": v} for k, v in summary.items()]
    return rows, summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    print(measure_step(parser.parse_args().rounds)[1])
