"""Memory levers: peak memory and steady-state tokens/s of one model where logits and
activations dominate, and which lever recipe keeps peak ≤ 0.3 of vanilla fastest.

A ~48M-parameter Qwen3-style model (vocab 32k, 4096 tokens per micro-batch) trains real
steps (`Trainer.train_step`, fp32) with no lever, each lever alone, and several
memory-tight recipes. Every run is a fresh subprocess (`tidal.trainer.memory_measure`):
peak = kernel high-water mark (VmHWM) above the resident size after a warm-up, with
glibc's mmap threshold pinned low so RSS follows live tensors; its first step is not
timed (allocation, page faults), the next ones are.

Throughput on a shared machine: the variants run in `--rounds` rounds, every variant
once per round in the same order (A B C … A B C …), so each variant sits beside vanilla
under similar load. A variant's ratio to vanilla is the median over rounds of
(vanilla's median step time in that round / its own); tokens/s is over all its timed
steps. The summary's memory-tight recipe is, among `TIGHT_RECIPES`, the fastest whose
peak is ≤ `PEAK_TARGET` of vanilla's (measured, not assumed).

A second, cheap table times the chunked LM head alone (forward + backward of the head
for the same 4096 tokens) at several chunk sizes against the dense head, interleaved.

`--device cuda` trains the same variants on the GPU in bf16, takes the peak as
`torch.cuda.max_memory_allocated` against the planner's CUDA prediction, and writes
`memory.cuda.json` (the head table is CPU-only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

from tidal.trainer.config import TrainerConfig
from tidal.trainer.memory_measure import measure
from tidal.trainer.memory_planner.estimate import Workload, plan_memory
from tidal.trainer.memory_planner.levers import Levers
from tidal.trainer.memory_planner.model_size import param_counts

TOKENS = 4096
PEAK_TARGET = 0.3
MODEL = {
    "family": "qwen3", "dim": 512, "n_layers": 10, "n_heads": 8, "n_kv_heads": 4,
    "head_dim": 64, "ffn_dim": 1536, "vocab_size": 32000, "max_seq_len": 1024,
}  # fmt: skip
AC_FULL = {"model": {"ac": {"mode": "full"}}}
CHUNKED = {"model": {"fused_lm_head_token_chunk_size": "auto"}}
DISK = {"optim": {"optim_offload": "disk"}}
VARIANTS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    "ac full": AC_FULL,
    "ac full, every 2nd block": {"model": {"ac": {"mode": "full", "freq": 2}}},
    "ac selective (norm, mlp)": {
        "model": {"ac": {"mode": "selective", "targets": ["norm", "mlp"]}}
    },
    "chunked LM head (auto)": CHUNKED,
    "activation offloading": {"model": {"ac_offloading": {}}},
    "optimizer on disk": DISK,
}
# Memory-tight candidates (offloads to the host save nothing on a CPU run, where the host
# is the device, so they stay out). `optim_cpu_offload` is not measured for that reason
# (its parity and resume are tested in tests/unit/trainer/memory/test_optim_state_offload*.py).
TIGHT_RECIPES: dict[str, tuple[str, ...]] = {
    "tight: ac full + chunked head + optimizer on disk": (
        "ac full",
        "chunked LM head (auto)",
        "optimizer on disk",
    ),
    "tight: ac full + chunked head": ("ac full", "chunked LM head (auto)"),
}
HEAD_CHUNKS = (256, "auto", 1024, 2048)
PRECISION = {"cpu": "fp32", "cuda": "bf16"}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def _config(overrides: dict[str, Any], device: str) -> TrainerConfig:
    base = {"model": MODEL, "device": device, "num_threads": 2}
    if device == "cuda":
        base["precision"] = PRECISION[device]
    return TrainerConfig.model_validate(_merge(base, overrides))


def _configs(device: str) -> dict[str, TrainerConfig]:
    configs = {name: _config(overrides, device) for name, overrides in VARIANTS.items()}
    for name, parts in TIGHT_RECIPES.items():
        overrides: dict[str, Any] = {}
        for part in parts:
            overrides = _merge(overrides, VARIANTS[part])
        configs[name] = _config(overrides, device)
    return configs


def _peak(run: dict[str, Any]) -> float:
    """The device's high-water mark: CUDA's allocator on a GPU, else the host's."""
    return run.get("cuda_max_allocated_bytes", run["peak_bytes"])


def _rows(configs: dict[str, TrainerConfig], runs: dict[str, list[dict]]) -> list[dict]:
    base = runs["vanilla"]
    base_peak = statistics.median(_peak(r) for r in base)
    rows = []
    for name, config in configs.items():
        mine = runs[name]
        peak = statistics.median(_peak(r) for r in mine)
        device = config.device if config.device == "cuda" else "cpu"
        workload = Workload(TOKENS, device=device, precision=PRECISION[device])
        plan = plan_memory(config.model.decoder_args(), Levers.from_config(config), workload)
        ratios = [b["step_seconds"] / m["step_seconds"] for b, m in zip(base, mine, strict=True)]
        rows.append(
            {
                "variant": name,
                "peak MiB": peak / 2**20,
                "predicted MiB": plan.peak / 2**20,
                "s/step (median)": statistics.median(t for r in mine for t in r["step_times"]),
                "tokens/s": TOKENS / statistics.median(t for r in mine for t in r["step_times"]),
                "peak vs vanilla": peak / base_peak,
                "tokens/s vs vanilla": statistics.median(ratios),
                "ratio per round": ", ".join(f"{x:.2f}" for x in ratios),
            }
        )
    return rows


def _head_table(repeats: int) -> list[dict]:
    """Head only (forward + backward over 4096 tokens): dense vs chunk sizes, interleaved."""
    import torch

    from tidal.trainer.memory.chunk_size import resolve_chunk_size
    from tidal.trainer.memory.lm_head import chunked_logprobs_entropy

    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    vocab, dim = MODEL["vocab_size"], MODEL["dim"]
    hidden = torch.randn(TOKENS, dim, generator=g, requires_grad=True)  # (N, D)
    weight = (torch.randn(vocab, dim, generator=g) * 0.02).requires_grad_()  # (V, D)
    targets = torch.randint(0, vocab, (TOKENS,), generator=g)  # (N,)

    def dense() -> tuple[torch.Tensor, torch.Tensor]:  # what train_step does without the lever
        log_p = torch.log_softmax((hidden @ weight.T).float(), dim=-1)  # (N, V)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (N,)
        return log_p.gather(-1, targets[:, None]).squeeze(-1), entropy

    heads: dict[str, Any] = {"dense": dense}
    for setting in HEAD_CHUNKS:
        chunk = resolve_chunk_size(setting, vocab)
        assert chunk is not None
        heads[f"chunk {chunk}" + (" (auto)" if setting == "auto" else "")] = lambda c=chunk: (
            chunked_logprobs_entropy(hidden, weight, targets, chunk=c)
        )
    times: dict[str, list[float]] = {name: [] for name in heads}
    for round_ in range(repeats + 1):
        for name, head in heads.items():
            hidden.grad = weight.grad = None
            start = time.perf_counter()
            logprobs, entropy = head()
            (logprobs.sum() + 0.01 * entropy.sum()).backward()
            if round_:  # round 0 warms up
                times[name].append(time.perf_counter() - start)
    dense_s = statistics.median(times["dense"])
    return [
        {
            "head": name,
            "s (median)": statistics.median(t),
            "vs dense": statistics.median(t) / dense_s,
        }
        for name, t in times.items()
    ]


def _write(
    configs: dict[str, TrainerConfig],
    runs: dict[str, list[dict]],
    head_rows: list[dict],
    meta: dict[str, Any],
    device: str,
) -> None:
    """Table and JSON from the rounds completed so far (written after every round)."""
    rows = _rows(configs, runs)
    where = f"{device.upper()}, {PRECISION[device]}"
    print_table(f"memory levers, {TOKENS} tokens per micro-batch ({where})", rows)
    tight = [r for r in rows if r["variant"] in TIGHT_RECIPES]
    fitting = [r for r in tight if r["peak vs vanilla"] <= PEAK_TARGET] or tight
    best = max(fitting, key=lambda r: r["tokens/s vs vanilla"])
    summary = {
        "tight_recipe": best["variant"],
        "tight_peak_fraction": best["peak vs vanilla"],
        "tight_throughput_fraction": best["tokens/s vs vanilla"],
        "prediction_error_median": statistics.median(
            abs(r["predicted MiB"] / r["peak MiB"] - 1) for r in rows
        ),
        "rounds_completed": len(runs["vanilla"]),
        **meta,
    }
    config = {
        "model": MODEL,
        "parameters": param_counts(configs["vanilla"].model.decoder_args()).total,
        "tokens_per_micro_batch": TOKENS,
        "steps_per_run": meta["steps_per_run"],
        "precision": PRECISION[device],
        "threads": 2,
        "device": meta.get("device_name", device),
    }
    name = "memory.cuda" if device == "cuda" else "memory"
    path = write_result(name, config=config, results=rows + head_rows, summary=summary)
    print(f"wrote {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="A B C … repeats")
    parser.add_argument("--steps", type=int, default=3, help="steps per run; the first untimed")
    parser.add_argument("--head-repeats", type=int, default=3, help="0 skips the head table")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    configs = _configs(args.device)
    on_cpu = args.device == "cpu"
    head_rows = _head_table(args.head_repeats) if args.head_repeats and on_cpu else []
    print_table(f"LM head alone, forward + backward, {TOKENS} tokens", head_rows)
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    loadavg: list[str] = []
    for round_ in range(args.rounds):
        for name, config in configs.items():
            print(f"round {round_ + 1}: {name} ...", flush=True)
            m = measure(config.model_dump_json(), tokens=TOKENS, steps=args.steps, timeout=3600)
            runs[name].append(m)
            loadavg.append(Path("/proc/loadavg").read_text().split()[0])
            print(f"  {m}", flush=True)
        meta = {"steps_per_run": args.steps, "load_average_1min": loadavg}
        if not on_cpu:
            meta["device_name"] = torch.cuda.get_device_name(0)
        _write(configs, runs, head_rows, meta, args.device)


if __name__ == "__main__":
    main()
