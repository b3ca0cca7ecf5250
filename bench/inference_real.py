"""`bench/inference.py --model-path DIR`: the RL shape on a real Hugging Face folder.

The native engine serves the folder's weights (`read_weights`, as `inference.model_path`
does; once as configured by default, with the native decode-attention kernel, once with
`compile_attention = false`, SDPA on gathered keys) and transformers
loads the same folder with `LlamaForCausalLM.from_pretrained`, all in one dtype. All get
the same chat-templated arithmetic prompts (8 prompts, rendered by the folder's own
template with a generation prompt) and draw 8 samples each of up to 48 new tokens at
temperature 1 with no top-k/top-p, stopping at the tokenizer's EOS ids: the RL rollout
shape. Runs alternate between systems; the rate is real tokens per second (up to and
including a stop token), medians compared.

Then the engine's decode step at that batch (all 64 sequences, after 24 tokens) is
profiled: the share of time per kind of work, with the LM head (vocabulary-wide matmul)
timed apart from the other linears, since a 49K vocabulary makes it a large one.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from opentelemetry import trace

from tidal.inference.config import InferenceConfig
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.models.hf_config import read_config
from tidal.models.hf_folder import read_weights
from tidal.text.hf_tokenizer import HFTokenizer

SDPA = "tidal native engine, SDPA decode attention"
PROMPTS, N, NEW_TOKENS = 8, 8, 48  # the RL shape: 8 prompts x 8 samples x 48 new tokens
SYSTEM = "Solve the arithmetic problem. Give the final answer as a number on the last line."


def arithmetic_prompts(tokenizer: HFTokenizer, count: int = PROMPTS) -> list[list[int]]:
    """`count` two-term, two-digit arithmetic questions rendered by the folder's template."""
    rng = random.Random(0)
    template = tokenizer.chat_template()
    prompts = []
    for _ in range(count):
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {a} {op} {b}?"},
        ]
        text = template.render(messages, add_generation_prompt=True)
        prompts.append(tokenizer.encode_template_text(text))
    return prompts


class NativeFolder:
    """The native engine serving the folder as version 0, fed every prompt at once."""

    def __init__(
        self,
        folder: Path,
        dtype: torch.dtype,
        stop_ids: tuple[int, ...],
        *,
        compile_attention: bool = True,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop_ids = stop_ids
        cfg = InferenceConfig()
        self.engine = NativeEngine(
            device=torch.device("cpu"),
            dtype=dtype,
            max_batch_size=PROMPTS * N,
            max_queue=cfg.max_queue,
            max_step_tokens=cfg.max_step_tokens,
            kv_cache_mb=cfg.kv_cache_mb,
            compile_attention=compile_attention,
        )
        self.loop.run_until_complete(self.engine.start())
        hf_config, state = read_config(folder), read_weights(folder)
        self.loop.run_until_complete(self.engine.update_weights(0, hf_config, state))

    def generate(self, prompts: list[list[int]], seed: int) -> list[list[int]]:
        async def one(i: int, prompt: list[int]) -> list[list[int]]:
            params = SamplingParams(
                NEW_TOKENS, temperature=1.0, seed=seed * 1000 + i, stop_token_ids=self.stop_ids, n=N
            )
            done = [c async for c in self.engine.generate(prompt, params)]
            return [c.token_ids for c in sorted(done, key=lambda c: c.index)]

        async def run() -> list[list[int]]:
            groups = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
            return [t for group in groups for t in group]

        return self.loop.run_until_complete(run())

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.close())
        self.loop.close()


class TransformersFolder:
    """transformers `generate()` on the same folder: left-padded batch, 8 returns each."""

    def __init__(self, folder: Path, dtype: torch.dtype, stop_ids: tuple[int, ...]) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        self.stop_ids = stop_ids

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        width = max(len(p) for p in prompts)
        pad = self.stop_ids[0]
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=list(self.stop_ids),
            pad_token_id=pad,
            num_return_sequences=N,
        )
        return [self._until_stop(c) for c in out[:, width:].tolist()]

    def _until_stop(self, tokens: list[int]) -> list[int]:
        end = next((i + 1 for i, t in enumerate(tokens) if t in self.stop_ids), len(tokens))
        return tokens[:end]


def measure_real(
    folder: Path, dtype: torch.dtype, repeats: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(table rows, summary): transformers and the engine, by default and with SDPA decode
    attention (`compile_attention = false`), alternating on the RL shape; medians."""
    tokenizer = HFTokenizer.from_folder(folder)
    stop_ids = tuple(tokenizer.eos_ids)
    prompts = arithmetic_prompts(tokenizer)
    engines = {
        "tidal native engine": NativeFolder(folder, dtype, stop_ids),
        SDPA: NativeFolder(folder, dtype, stop_ids, compile_attention=False),
    }
    systems: dict[str, Any] = {
        "transformers generate()": TransformersFolder(folder, dtype, stop_ids),
        **engines,
    }
    for system in systems.values():
        system.generate(prompts[:2], seed=99)  # warm-up: allocator, thread pool, kernels
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in systems}
    loads: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(repeats):  # interleaved, so load drift hits both alike
        for name, system in systems.items():
            loads[name].append(os.getloadavg()[0])  # the machine is shared: say how busy
            started = time.perf_counter()
            tokens = system.generate(prompts, seed=r)
            runs[name].append((time.perf_counter() - started, sum(len(t) for t in tokens)))
    kernels = {name: engine.engine.status().kernels for name, engine in engines.items()}
    for engine in engines.values():
        engine.close()
    rows, rate = [], {}
    for name, pairs in runs.items():
        rate[name] = statistics.median(n / s for s, n in pairs)
        rows.append(
            {
                "system": f"{name} {str(dtype).removeprefix('torch.')}",
                "median_s": statistics.median(s for s, _ in pairs),
                "tokens_per_s": rate[name],
                "mean_completion_tokens": statistics.mean(n for _, n in pairs) / (PROMPTS * N),
                "runs_s": ", ".join(f"{s:.1f}" for s, _ in pairs),
                "load_1min_at_runs": ", ".join(f"{x:.1f}" for x in loads[name]),
            }
        )
    hf = runs["transformers generate()"]

    def paired(name: str) -> list[float]:
        return [
            round((cn / tn) / (ch / th), 2)
            for (tn, cn), (th, ch) in zip(runs[name], hf, strict=True)
        ]

    summary = {
        "speedup_vs_hf_rl_real": round(
            rate["tidal native engine"] / rate["transformers generate()"], 3
        ),
        "paired_speedups": paired("tidal native engine"),
        "speedup_vs_hf_rl_real_sdpa_attention": round(
            rate[SDPA] / rate["transformers generate()"], 3
        ),
        "paired_speedups_sdpa_attention": paired(SDPA),
        "kernels": kernels,
        "prompt_lengths": [len(p) for p in prompts],
    }
    return rows, summary


# Top-level profiler ops of the forward → kind of work (LM head timed apart, below).
FORWARD_KINDS = {
    "mkldnn::_linear_pointwise": "linears (incl. LM head)",
    "aten::linear": "linears (incl. LM head)",
    "aten::index_select": "KV gather (paged blocks → contiguous)",
    "aten::index_copy_": "KV-cache writes",
    "aten::index_put_": "KV-cache writes",
    "tidal::paged_decode": "attention (native paged kernel)",
    "aten::scaled_dot_product_attention": "attention (SDPA)",
    "aten::matmul": "attention (SDPA)",
    "aten::rms_norm": "RMSNorm",
}


def _timed(func: Any, into: list[float]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = func(*args, **kwargs)
        into.append(time.perf_counter() - started)
        return out

    return wrapper


def decode_profile(
    folder: Path, dtype: torch.dtype, *, warm_steps: int = 24, steps: int = 8
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The engine's decode step at the RL batch (64 sequences), split by hand and profiled."""
    from torch.profiler import ProfilerActivity, profile

    from tidal.inference.batching import Batcher
    from tidal.inference.block_manager import blocks_for
    from tidal.inference.decode_attention import choose_decode_attention
    from tidal.inference.kv_cache import PagedKVCache
    from tidal.inference.loading import build_model, load_weights
    from tidal.inference.packed_linear import pack_linears
    from tidal.inference.scheduler import Extend
    from tidal.inference.sequence import Request, Sequence

    tokenizer = HFTokenizer.from_folder(folder)
    prompts = [p for p in arithmetic_prompts(tokenizer) for _ in range(N)]
    batch = len(prompts)
    model = build_model(read_config(folder), device=torch.device("cpu"), dtype=dtype)
    pack_linears(model, batch_hint=batch)
    load_weights(model, read_weights(folder))
    total_steps = warm_steps + 2 * steps + 2
    per_sequence = blocks_for(max(len(p) for p in prompts) + total_steps, 16)
    attention = choose_decode_attention(
        torch.device("cpu"), compile_attention=InferenceConfig().compile_attention
    )  # the engine's own default
    cache = PagedKVCache(
        model.args,
        num_blocks=batch * per_sequence,
        block_size=16,
        dtype=dtype,
        device="cpu",
        decode_kernel=attention,
    )
    args = model.args
    attention.warm_up(
        heads=args.n_heads, kv_heads=args.n_kv_heads, head_dim=args.head_dim, dtype=dtype
    )
    batcher = Batcher(model, cache, max_seq_len=model.args.max_seq_len)
    params = SamplingParams(max_tokens=total_steps, temperature=1.0)
    rng = random.Random(0)
    sequences = []
    for prompt in prompts:
        uniforms = [rng.random() for _ in range(total_steps + 1)]
        owner = Request(prompt, params, 0, trace.INVALID_SPAN_CONTEXT, stream=False)
        s = Sequence(owner, 0, prompt, params, uniforms, total_steps)
        s.blocks = [cache.blocks.allocate() for _ in range(per_sequence)]
        sequences.append(s)
    batcher.extend([Extend(s, 0, len(s.prompt_ids), sample=True) for s in sequences], 0)
    for _ in range(warm_steps):
        batcher.decode(sequences, 0)
    parts: dict[str, list[float]] = {"step": [], "LM head": [], "sampling": [], "forward": []}
    batcher._sample = _timed(batcher._sample, parts["sampling"])  # type: ignore[method-assign]
    model.lm_head.forward = _timed(model.lm_head.forward, parts["LM head"])  # type: ignore[method-assign]
    batcher.model = _timed(model, parts["forward"])  # type: ignore[assignment]
    for _ in range(steps):
        started = time.perf_counter()
        batcher.decode(sequences, 0)
        parts["step"].append(time.perf_counter() - started)
    ms = {k: 1000 * statistics.median(v) for k, v in parts.items()}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            batcher.decode(sequences, 0)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    kinds: dict[str, float] = {}
    for event in events:
        if event.key in FORWARD_KINDS:
            kind = FORWARD_KINDS[event.key]
            kinds[kind] = kinds.get(kind, 0.0) + event.cpu_time_total / total
    step = ms["step"]
    split = {
        "LM head (576 → 49,152 matmul)": ms["LM head"] / step,
        "rest of the forward (30 blocks)": (ms["forward"] - ms["LM head"]) / step,
        "sampling (softmax, two-level CDF draw, logprobs)": ms["sampling"] / step,
        "outside forward and sampling (inputs, tables, mask, bookkeeping)": (
            step - ms["forward"] - ms["sampling"]
        )
        / step,
    }
    rows = [{"part": k, "share": f"{v:.1%}", "ms": v * step} for k, v in split.items()]
    rows += [
        {"part": f"  profiler: {k}", "share": f"{v:.1%}", "ms": v * step}
        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
    ]
    summary = {
        "decode_step_ms": round(step, 1),
        "batch": batch,
        "after_tokens": warm_steps,
        "split": {k: round(v, 3) for k, v in split.items()},
        "profiler_kinds": {k: round(v, 3) for k, v in kinds.items()},
    }
    return rows, summary
