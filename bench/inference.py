"""Generated tokens/s: the native engine vs Hugging Face `generate()`, same weights, one run.

A ~50M-parameter Llama is built from a config and random-initialized once; the native
engine serves its published state dict and transformers' `LlamaForCausalLM` loads the
same state dict (our parameter names are HF's, the config is `to_hf_config()`). Both get
the same 32 prompts of mixed lengths, as one batch, in two scenarios:

- `fixed`: greedy, 128 new tokens each, no early stop, so both produce exactly 32 x 128
  tokens (the issue's measure; the same tokens, which the agreement column checks).
- `eos`: sampling at temperature 1 with a set of stop tokens (1/40 of the vocabulary,
  standing in for EOS), up to 128 new tokens: completions of different lengths, as RL
  rollouts are. Tokens/s counts real tokens only (up to and including the stop token).
  The two systems draw different random numbers, so their lengths differ by chance; the
  mean length is reported beside the rate.
- `rl`: the RL shape: 4 prompts, n = 8 samples each (one request per prompt natively,
  `num_return_sequences=8` in transformers), temperature 1, the same stop tokens.
  `summary.speedup_vs_hf_rl` is the native engine's rate over transformers'.

Then `inference_kv.py` (same process, after the above): GRPO-group and 3-turn episode
latency with and without prefix caching on a smaller long-context model
(`summary.prefix_cache_speedup_multiturn`, `..._grpo`). `summary.kv_bytes_per_token`
and `kv_bytes_per_sequence_rl` are for this benchmark's main model in fp32 (the latter
is the rl scenario's mean sequence, rounded up to blocks). Then `inference_step.py`: the
engine's decode step at `rl_step.py`'s small RL shape (64 sequences of a ~4M model), split
into the model forward and the work around it (`summary.rl_small_step`).

Runs alternate between systems and the medians are compared, so drift on a shared
machine hits both alike.

Then one decode step of the engine at batch 32 (fixed scenario, after 40 steps), in each
dtype, is timed in four variants, interleaved, medians: the engine as it is (decode
attention by the native paged kernel); the same with SDPA on gathered keys, the GQA
group folded into the query axis; the same with SDPA's `enable_gqa` and a bool mask; and
plain `F.linear` instead of prepacked linears. The engine's step is profiled:
`summary.decode_step_profile_<dtype>` is the share of its time per kind of work.

On a CPU without native bf16 (`tidal.models.cpu_features`; AVX2-only, or capped with
`ONEDNN_MAX_CPU_ISA=AVX2`) a bfloat16 run measures the engine's fallback (bf16 weights
and cache, fp32 linears) and leaves out what runs on torch's plain bf16 matmul, ~50-100x
slower than fp32 there and unable to finish: transformers' bf16 `generate()` and the
plain-`F.linear` decode variant. `summary.skipped` lists them; `summary.kernels_<dtype>`
is the engine's own account of the path it ran, `machine.cpu_native_bf16` the probe's.

`--model-path DIR` runs the RL shape on a real Hugging Face folder instead (8 chat-templated
arithmetic prompts x 8 samples x 48 new tokens, each `--dtypes` entry, both systems on the
folder's weights) and profiles the engine's decode step there (`inference_real.py`); it
writes `inference.real.json`.

`--device cuda` runs both systems on the GPU and writes `inference.cuda.json`; the decode
step study, `inference_kv.py` and `inference_step.py` (CPU studies) are left out there.

`python bench/inference.py [--repeats N] [--dtypes float32 bfloat16] [--threads T]
[--scenarios fixed eos rl] [--kv-repeats N] [--step-rounds N] [--device cpu|cuda]
[--model-path DIR]`
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from opentelemetry import trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result
from inference_kv import measure_kv
from inference_real import decode_profile, measure_real
from inference_step import measure_step

from tidal.inference.batching import Batcher
from tidal.inference.block_manager import blocks_for
from tidal.inference.config import InferenceConfig
from tidal.inference.decode_attention import (
    BlockReads,
    DecodeKernel,
    choose_decode_attention,
    gather,
    sdpa_decode,
)
from tidal.inference.kv_cache import PagedKVCache, block_bytes
from tidal.inference.loading import build_model, load_weights
from tidal.inference.native import NativeEngine
from tidal.inference.packed_linear import pack_linears
from tidal.inference.sampling import SamplingParams
from tidal.inference.scheduler import Extend
from tidal.inference.sequence import Request, Sequence
from tidal.models.args import DecoderArgs
from tidal.models.attention import sdpa
from tidal.models.cpu_features import bf16_support
from tidal.models.device import DTYPES
from tidal.models.layers import DecoderLM

ARGS = DecoderArgs(
    vocab_size=32000, dim=512, n_layers=10, n_heads=8, n_kv_heads=4, ffn_dim=1536, max_seq_len=512
)
BATCH, NEW_TOKENS, PROMPT_LENS = 32, 128, (16, 48)
STOP_IDS = tuple(range(3, ARGS.vocab_size, 40))  # the `eos` scenario's stop set
SCENARIOS = ("fixed", "eos", "rl")
KV_BLOCK = 16  # the paged cache's default block_size
RL_PROMPTS, RL_N = 4, 8  # the rl scenario: 4 prompts x 8 samples = BATCH sequences


def make_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(PROMPT_LENS[0], PROMPT_LENS[1] + 1, (BATCH,), generator=g)
    return [torch.randint(3, ARGS.vocab_size, (int(n),), generator=g).tolist() for n in lengths]


def build_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = DecoderLM(ARGS)
    model.init_weights(std=0.1)  # peaked enough that greedy argmaxes have clear margins
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}


def rl_prompts(prompts: list[list[int]], scenario: str) -> list[list[int]]:
    """The prompts a scenario sends: the rl one sends 4, each sampled n = 8 times."""
    return prompts[:RL_PROMPTS] if scenario == "rl" else prompts


def until_stop(tokens: list[int]) -> list[int]:
    """A completion up to and including its first stop token."""
    stops = set(STOP_IDS)
    end = next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))
    return tokens[:end]


class Native:
    """The engine on its own event loop, fed all prompts at once (as concurrent requests)."""

    def __init__(
        self, state: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device
    ) -> None:
        self.loop = asyncio.new_event_loop()
        cfg = InferenceConfig()
        self.engine = NativeEngine(
            device=device,
            dtype=dtype,
            max_batch_size=BATCH,
            max_queue=cfg.max_queue,
            max_step_tokens=cfg.max_step_tokens,
            kv_cache_mb=cfg.kv_cache_mb,
        )
        self.loop.run_until_complete(self.engine.start())
        self.loop.run_until_complete(self.engine.update_weights(0, ARGS.to_hf_config(), state))

    def generate(self, prompts: list[list[int]], scenario: str) -> list[list[int]]:
        n = RL_N if scenario == "rl" else 1

        def params(i: int) -> SamplingParams:
            if scenario == "fixed":
                return SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
            return SamplingParams(NEW_TOKENS, temperature=1.0, seed=i, stop_token_ids=STOP_IDS, n=n)

        async def one(i: int, prompt: list[int]) -> list[list[int]]:
            done = [c async for c in self.engine.generate(prompt, params(i))]
            return [c.token_ids for c in sorted(done, key=lambda c: c.index)]

        async def run() -> list[list[int]]:
            jobs = (one(i, p) for i, p in enumerate(rl_prompts(prompts, scenario)))
            return [t for group in await asyncio.gather(*jobs) for t in group]

        return self.loop.run_until_complete(run())

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.close())
        self.loop.close()


class HuggingFace:
    def __init__(
        self, state: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device
    ) -> None:
        from transformers import LlamaConfig
        from transformers import LlamaForCausalLM as HFLlama

        config = LlamaConfig(**ARGS.to_hf_config(), pad_token_id=0)
        self.model = HFLlama(config).to(dtype).eval()
        self.device = device
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        self.model.tie_weights()
        self.model.to(device)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], scenario: str) -> list[list[int]]:
        prompts = rl_prompts(prompts, scenario)
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)  # left-padded, as HF expects
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        if scenario == "fixed":
            options: dict[str, Any] = {"do_sample": False, "min_new_tokens": NEW_TOKENS}
        else:  # full-distribution sampling, like the engine's: no default top-k
            options = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
            options["eos_token_id"] = list(STOP_IDS)
        if scenario == "rl":
            options["num_return_sequences"] = RL_N  # each prompt's 8 samples, in order
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=NEW_TOKENS,
            pad_token_id=0,
            **options,
        )
        completions = out[:, width:].tolist()
        return completions if scenario == "fixed" else [until_stop(c) for c in completions]


class _GqaSdpaDecode:
    """Decode attention as SDPA with `enable_gqa` and a bool mask: one query row per head."""

    name = "sdpa, enable_gqa"

    def warm_up(self, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        pass

    def __call__(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, reads: BlockReads
    ) -> torch.Tensor:
        k, v = gather(keys, values, reads)  # (B, Hkv, S, D)
        additive = reads.additive_mask(q.dtype)  # (B, 1, 1, S) bool, True = attend, or None
        visible = None if additive is None else torch.isfinite(additive)
        return sdpa(q, k, v, mask=visible, causal=False)


def _engine_attention() -> DecodeKernel:
    """The engine's own decode attention on CPU, as configured by default."""
    default = InferenceConfig().compile_attention
    return choose_decode_attention(torch.device("cpu"), compile_attention=default)


# Decode-step variants: (linears, decode attention); the engine's own is last.
VARIANTS: dict[str, tuple[str, Callable[[], DecodeKernel]]] = {
    "plain F.linear": ("plain", _engine_attention),
    "GQA SDPA, bool mask": ("packed", _GqaSdpaDecode),
    "folded-GQA SDPA": ("packed", lambda: sdpa_decode),
    "engine (packed, native paged attention)": ("packed", _engine_attention),
}


def running_batch(
    state: dict[str, torch.Tensor],
    prompts: list[list[int]],
    *,
    variant: tuple[str, Callable[[], DecodeKernel]],
    dtype: torch.dtype,
    steps: int,
) -> tuple[Batcher, list[Sequence]]:
    """The engine's batcher with all prompts prefilled and `steps` greedy tokens decoded."""
    linears, attention = variant
    model = build_model(ARGS.to_hf_config(), device=torch.device("cpu"), dtype=dtype)
    if linears == "packed":
        pack_linears(model, batch_hint=BATCH)
    load_weights(model, state)
    per_sequence = blocks_for(max(len(p) for p in prompts) + NEW_TOKENS, KV_BLOCK)
    cache = PagedKVCache(
        model.args,
        num_blocks=BATCH * per_sequence,
        block_size=KV_BLOCK,
        dtype=dtype,
        device="cpu",
        decode_kernel=attention(),
    )
    batcher = Batcher(model, cache, max_seq_len=ARGS.max_seq_len)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
    sequences = []
    for prompt in prompts:
        owner = Request(prompt, params, 0, trace.INVALID_SPAN_CONTEXT, stream=False)
        s = Sequence(owner, 0, prompt, params, [0.0] * NEW_TOKENS, NEW_TOKENS)
        s.blocks = [cache.blocks.allocate() for _ in range(per_sequence)]
        sequences.append(s)
    batcher.extend(
        [
            Extend(s, 0, len(prompt), sample=True)
            for s, prompt in zip(sequences, prompts, strict=True)
        ],
        0,
    )
    for _ in range(steps):
        batcher.decode(sequences, 0)
    return batcher, sequences


# Top-level profiler ops (their time including the ops they call) → the kind of work;
# the rest of the step's CPU time is "other".
OP_KINDS = {
    "mkldnn::_linear_pointwise": "linear layers (matmuls)",
    "aten::linear": "linear layers (matmuls)",
    "aten::scaled_dot_product_attention": "attention (SDPA over the cache)",
    "tidal::paged_decode": "attention (native paged kernel)",
    "aten::index_select": "KV gather (paged blocks → contiguous)",
    "aten::index_copy_": "KV-cache writes",
    "aten::index_put_": "KV-cache writes",
    "aten::rms_norm": "RMSNorm",
    "aten::log_softmax": "greedy sampling (log-softmax, argmax)",
    "aten::argmax": "greedy sampling (log-softmax, argmax)",
}
OTHER = "other (rope, residuals, SiLU, indexing, Python)"


def slow_on_this_cpu(dtype: torch.dtype) -> bool:
    """bf16 on a CPU without native bf16: torch's plain bf16 matmul cannot finish here."""
    return dtype == torch.bfloat16 and not bf16_support().native


def decode_step_study(
    state: dict[str, torch.Tensor], prompts: list[list[int]], dtype: torch.dtype, steps: int = 12
) -> tuple[dict[str, float], dict[str, float]]:
    """(median ms of one decode step per variant; the engine's step's share of time per kind)."""
    from torch.profiler import ProfilerActivity, profile

    state = {k: v.to(dtype) for k, v in state.items()}
    variants = {
        name: running_batch(state, prompts, variant=v, dtype=dtype, steps=40)
        for name, v in VARIANTS.items()
        if not (v[0] == "plain" and slow_on_this_cpu(dtype))
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(steps):  # interleaved: load drift hits all alike
        for name, (batcher, sequences) in variants.items():
            started = time.perf_counter()
            batcher.decode(sequences, 0)
            times[name].append(time.perf_counter() - started)
    step_ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    batcher, sequences = variants[list(VARIANTS)[-1]]  # the engine's own
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            batcher.decode(sequences, 0)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    kinds: dict[str, float] = {}
    for event in events:
        if event.key in OP_KINDS:
            kind = OP_KINDS[event.key]
            kinds[kind] = kinds.get(kind, 0.0) + event.cpu_time_total / total
    kinds[OTHER] = 1 - sum(kinds.values())
    return step_ms, {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}


def kv_summary(runs: dict[Any, Any], cli: argparse.Namespace) -> dict[str, Any]:
    """KV-cache memory per token and per rl sequence for this model, then `inference_kv.py`'s
    figures (prefix caching on GRPO groups and turns, on a long-context model)."""
    out: dict[str, Any] = {}
    per_token = block_bytes(ARGS, torch.float32, KV_BLOCK) / KV_BLOCK
    out["kv_bytes_per_token"] = per_token
    if ("native", "float32", "rl") in runs:
        prompts = rl_prompts(make_prompts(), "rl")
        tokens = runs["native", "float32", "rl"][2]
        held = [len(prompts[i // RL_N]) + len(t) for i, t in enumerate(tokens)]
        blocks = statistics.mean(blocks_for(n, KV_BLOCK) for n in held)
        out["kv_bytes_per_sequence_rl"] = round(blocks * KV_BLOCK * per_token)
    kv_rows, kv = asyncio.run(measure_kv(cli.kv_repeats))
    print_table("prefix caching on and off (inference_kv.py, medians)", kv_rows)
    out["kv_cache"] = kv | {"medians": {r["measure"]: r["median"] for r in kv_rows}}
    out["prefix_cache_speedup_multiturn"] = round(kv["prefix_cache_speedup_multiturn"], 3)
    out["prefix_cache_speedup_grpo"] = round(kv["prefix_cache_speedup_grpo"], 3)
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions where two runs generated the same token."""
    same = sum(x == y for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
    return same / max(1, sum(len(r) for r in a))


def measure(
    systems: dict[tuple[str, str], Any],
    prompts: list[list[int]],
    repeats: int,
    scenarios: list[str],
) -> dict[tuple[str, str, str], tuple[list[float], list[int], list[list[int]]]]:
    """(system, dtype, scenario) → (seconds per run, tokens per run, last run's tokens)."""
    runs: dict[tuple[str, str, str], tuple[list[float], list[int], list[list[int]]]] = {}
    for _ in range(repeats):  # interleaved, so load drift on the machine hits all alike
        for scenario in scenarios:
            for (name, dtype), system in systems.items():
                started = time.perf_counter()
                tokens = system.generate(prompts, scenario)
                seconds = time.perf_counter() - started
                times, counts, _ = runs.setdefault((name, dtype, scenario), ([], [], []))
                times.append(seconds)
                counts.append(sum(len(t) for t in tokens))
                runs[name, dtype, scenario] = (times, counts, tokens)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32"])
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own choice)"
    )
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--kv-repeats", type=int, default=3, help="inference_kv.py's rounds")
    parser.add_argument("--step-rounds", type=int, default=10, help="inference_step.py's rounds")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--model-path", type=Path, default=None, help="a real HF folder: the RL shape on it"
    )
    cli = parser.parse_args()
    if cli.model_path is not None:
        if cli.threads is not None:
            torch.set_num_threads(cli.threads)
        real_model(cli)
        return
    if cli.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    device, on_gpu = torch.device(cli.device), cli.device == "cuda"
    load_before = os.getloadavg()
    if cli.threads is not None:
        torch.set_num_threads(cli.threads)
    prompts, state = make_prompts(), build_state()
    systems: dict[tuple[str, str], Any] = {}
    skipped: list[str] = []
    for dtype in cli.dtypes:
        if not on_gpu and slow_on_this_cpu(DTYPES[dtype]):
            skipped += [f"transformers generate() {dtype}", f"decode step plain F.linear {dtype}"]
        else:
            systems["hf", dtype] = HuggingFace(state, DTYPES[dtype], device)
        systems["native", dtype] = Native(state, DTYPES[dtype], device)
    for system in systems.values():
        system.generate(prompts[:4], "fixed")  # warm-up: allocator, thread pool, kernels
    runs = measure(systems, prompts, cli.repeats, cli.scenarios)
    kernels = {}
    for (name, dtype), system in systems.items():
        if name == "native":
            kernels[dtype] = system.engine.status().kernels
            system.close()
    labels = {"hf": "transformers generate()", "native": "tidal native engine"}
    rows, rate = [], {}
    for (name, dtype, scenario), (times, counts, tokens) in runs.items():
        rate[name, dtype, scenario] = statistics.median(
            c / t for c, t in zip(counts, times, strict=True)
        )
        hf = runs.get(("hf", dtype, scenario))
        same = agreement(tokens, hf[2]) if scenario == "fixed" and hf else None
        rows.append(
            {
                "scenario": scenario,
                "system": f"{labels[name]} {dtype}",
                "median_s": statistics.median(times),
                "tokens_per_s": rate[name, dtype, scenario],
                "mean_completion_tokens": statistics.mean(counts) / len(tokens),
                "same_tokens_as_hf": "-" if same is None else f"{same:.1%}",
                "runs_s": ", ".join(f"{t:.1f}" for t in times),
            }
        )
    summary: dict[str, Any] = {"skipped": skipped}
    for dtype in cli.dtypes:
        summary[f"kernels_{dtype}"] = kernels[dtype]
        if ("hf", dtype) not in systems:
            continue
        for scenario in cli.scenarios:
            ratio = rate["native", dtype, scenario] / rate["hf", dtype, scenario]
            summary[f"speedup_vs_hf_{scenario}_{dtype}"] = round(ratio, 3)
            # Each repeat's ratio of neighbouring runs: how far load drift spreads it.
            (tn, cn, _), (th, ch, _) = runs["native", dtype, scenario], runs["hf", dtype, scenario]
            summary[f"paired_speedups_{scenario}_{dtype}"] = [
                round((n / a) / (h / b), 2) for n, a, h, b in zip(cn, tn, ch, th, strict=True)
            ]
    # The headline is the measure: fixed length, both in the first dtype (fp32).
    for scenario in cli.scenarios:
        key = "speedup_vs_hf" if scenario == "fixed" else f"speedup_vs_hf_{scenario}"
        summary[key] = summary.get(f"speedup_vs_hf_{scenario}_{cli.dtypes[0]}")
    if on_gpu:
        summary["skipped"] += [
            "decode step study (CPU kernels)",
            "inference_kv.py (CPU)",
            "inference_step.py (CPU)",
        ]
    else:
        summary.update(kv_summary(runs, cli))
        step_table, summary["rl_small_step"] = measure_step(cli.step_rounds)
        print_table("decode step at the small RL shape (inference_step.py, ms)", step_table)
    step_rows, step_shares = [], {}
    for dtype in [] if on_gpu else cli.dtypes:
        step_ms, step_shares[dtype] = decode_step_study(state, prompts, DTYPES[dtype])
        now = step_ms[list(VARIANTS)[-1]]
        for name, ms in step_ms.items():
            step_rows.append({"dtype": dtype, "decode step": name, "ms": ms, "x engine": ms / now})
        summary[f"decode_step_ms_{dtype}"] = {k: round(v, 1) for k, v in step_ms.items()}
        summary[f"decode_step_profile_{dtype}"] = step_shares[dtype]
    summary["decode_step_profile"] = step_shares.get(cli.dtypes[0])
    print_table(f"Generation, batch {BATCH}, up to {NEW_TOKENS} new tokens", rows)
    print_table(f"One decode step, batch {BATCH}, after 40 tokens (interleaved)", step_rows)
    for dtype, shares in step_shares.items():
        print_table(
            f"The engine's decode step, batch {BATCH}, {dtype}: share of time",
            [{"kind": k, "share": f"{v:.1%}"} for k, v in shares.items()],
        )
    print(summary)
    summary["load_average"] = {"before": load_before, "after": os.getloadavg()}
    write_result(
        "inference.cuda" if on_gpu else "inference",
        config={
            "model": ARGS.as_dict(),
            "parameters": sum(v.numel() for v in state.values()),
            "dtypes": cli.dtypes,
            "batch": BATCH,
            "new_tokens": NEW_TOKENS,
            "prompt_lengths": [len(p) for p in prompts],
            "eos_stop_ids": f"every 40th id from 3 ({len(STOP_IDS)} ids)",
            "repeats": cli.repeats,
            "kv_repeats": cli.kv_repeats,
            "rl": f"{RL_PROMPTS} prompts x n = {RL_N}, temperature 1, stop tokens",
            "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        },
        results=rows,
        summary=summary,
    )


def real_model(cli: argparse.Namespace) -> None:
    """The RL shape on `cli.model_path`, each dtype, then the engine's decode-step profile."""
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"folder": str(cli.model_path)}
    for dtype in cli.dtypes:
        real_rows, real_summary = measure_real(cli.model_path, DTYPES[dtype], cli.repeats)
        rows += real_rows
        summary[dtype] = real_summary
        print_table(f"RL shape on {cli.model_path.name}, {dtype}", real_rows)
        step_rows, summary[f"decode_step_{dtype}"] = decode_profile(cli.model_path, DTYPES[dtype])
        print_table(f"The engine's decode step on {cli.model_path.name}, {dtype}", step_rows)
    summary["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(summary)
    write_result(
        "inference.real",
        config={
            "model_path": str(cli.model_path),
            "dtypes": cli.dtypes,
            "rl": "8 chat-templated arithmetic prompts x n = 8, <= 48 new tokens, T = 1, EOS",
            "repeats": cli.repeats,
            "threads": torch.get_num_threads(),
        },
        results=rows,
        summary=summary,
    )


if __name__ == "__main__":
    main()
