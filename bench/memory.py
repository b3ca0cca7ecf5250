"""Memory levers: peak memory and tokens/s of one model where logits and activations dominate.

A ~48M-parameter Qwen3-style model (vocab 32k, 4096 tokens per micro-batch) trains real
steps (`Trainer.train_step`, fp32) with no lever, each lever alone, and the memory-tight
recipe, side by side in one run. Every variant runs in its own fresh subprocess
(`tidal.trainer.plan.measure`): peak = kernel high-water mark (VmHWM) above the resident
size after a warm-up, with glibc's mmap threshold pinned low so RSS follows live tensors;
tokens/s = tokens / median step time of the steps after the first. The planner's
prediction for each variant is printed beside the measurement.

Variants are one line each in `VARIANTS` (trainer-config overrides). A lever whose config
fields this checkout does not have yet (issue 7a's levers before they merge) is reported
as "not available" and left out of the tight recipe, which then uses what exists.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

from tidal.trainer.config import TrainerConfig
from tidal.trainer.plan.estimate import Workload, plan_memory
from tidal.trainer.plan.levers import Levers
from tidal.trainer.plan.measure import measure
from tidal.trainer.plan.model_size import decoder_args, param_counts

TOKENS = 4096
STEPS = 2  # the second step is timed (steps take minutes on a shared 2-core CPU)
MODEL = {
    "family": "qwen3", "dim": 512, "n_layers": 10, "n_heads": 8, "n_kv_heads": 4,
    "head_dim": 64, "ffn_dim": 1536, "vocab_size": 32000, "max_seq_len": 1024,
}  # fmt: skip
VARIANTS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    "ac full": {"model": {"ac": {"mode": "full"}}},
    "ac selective": {"model": {"ac": {"mode": "selective", "targets": ["norm", "mlp"]}}},
    "chunked LM head": {"model": {"fused_lm_head_token_chunk_size": "auto"}},
    "activation offloading": {"model": {"ac_offloading": {}}},
    "optimizer on disk": {"optim": {"optim_offload": "disk"}},
}
# Not measured here: `optim_cpu_offload` keeps states in host memory, which on a CPU run
# is the device (no saving; its parity and resume are tested in tests/unit/trainer/offload).
# The memory-tight recipe: the levers that cut peak on a CPU host (offloads to the host
# save nothing when the host is the device, so they stay out of it).
TIGHT = ("ac full", "chunked LM head", "optimizer on disk")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def _config(overrides: dict[str, Any]) -> TrainerConfig:
    base = {"model": MODEL, "device": "cpu", "num_threads": 2}
    return TrainerConfig.model_validate(_merge(base, overrides))


def main() -> None:
    configs: dict[str, TrainerConfig] = {}
    missing = []
    for name, overrides in VARIANTS.items():
        try:
            configs[name] = _config(overrides)
        except ValidationError:
            missing.append(name)
    tight_parts = [VARIANTS[n] for n in TIGHT if n in configs]
    tight_overrides: dict[str, Any] = {}
    for part in tight_parts:
        tight_overrides = _merge(tight_overrides, part)
    configs["memory-tight"] = _config(tight_overrides)
    rows, results = [], {}
    for name, config in configs.items():
        print(f"measuring {name} ...", flush=True)
        m = measure(config.model_dump_json(), tokens=TOKENS, steps=STEPS, timeout=1800)
        plan = plan_memory(decoder_args(config.model), Levers.from_config(config), Workload(TOKENS))
        results[name] = m
        print(f"  {name}: {m}", flush=True)
        rows.append(
            {
                "variant": name,
                "peak MiB": m["peak_bytes"] / 2**20,
                "predicted MiB": plan.peak / 2**20,
                "tokens/s": TOKENS / m["step_seconds"],
                "peak vs vanilla": m["peak_bytes"] / results["vanilla"]["peak_bytes"],
                "tokens/s vs vanilla": results["vanilla"]["step_seconds"] / m["step_seconds"],
            }
        )
    for name in missing:
        rows.append({"variant": f"{name} (not available)", **dict.fromkeys(list(rows[0])[1:], "")})
    print_table(f"memory levers, {TOKENS} tokens per micro-batch (CPU, fp32)", rows)
    tight = next(r for r in rows if r["variant"] == "memory-tight")
    summary = {
        "tight_peak_fraction": tight["peak vs vanilla"],
        "tight_throughput_fraction": tight["tokens/s vs vanilla"],
        "tight_levers": [n for n in TIGHT if n in configs],
        "levers_not_available": missing,
        "prediction_error_median": statistics.median(
            abs(r["predicted MiB"] / r["peak MiB"] - 1) for r in rows if r["peak MiB"] != ""
        ),
    }
    config = {
        "model": MODEL,
        "parameters": param_counts(decoder_args(configs["vanilla"].model)).total,
        "tokens_per_micro_batch": TOKENS,
        "steps": STEPS,
        "precision": "fp32",
        "threads": 2,
    }
    path = write_result("memory", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
