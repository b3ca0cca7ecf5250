"""Measure the peak memory and speed of real training steps, to hold the planner to.

Each measurement runs in a fresh subprocess, so one configuration's allocations and
caches do not colour the next. The host peak is the kernel's high-water mark (`VmHWM`,
reset after a warm-up step) with glibc's mmap threshold pinned low, so RSS follows live
tensors; on CUDA `max_memory_allocated` too. The batch is synthetic but goes through
`Trainer.train_step`, the production step.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.trainer.config import TrainerConfig
from tidal.trainer.train_step import Trainer

MMAP_THRESHOLD = "65536"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _batch(tokens: int, sample_len: int, vocab: int, seed: int) -> MicroBatchData:
    g = torch.Generator().manual_seed(seed)
    lengths = [sample_len] * (tokens // sample_len) + (
        [tokens % sample_len] * (tokens % sample_len > 0)
    )
    lengths_t = torch.tensor(lengths)
    mask = torch.cat([(torch.arange(n) >= 1).float() for n in lengths])  # (T,)
    return MicroBatchData(
        input_ids=torch.randint(0, vocab, (tokens,), generator=g),
        position_ids=positions_for(lengths_t),
        sample_lengths=lengths_t,
        loss_mask=mask,
        advantages=torch.randn(tokens, generator=g) * mask,
        behaviour_logprobs=-torch.rand(tokens, generator=g) * 5 * mask,
    )


def run(trainer_json: str, tokens: int, steps: int, sample_len: int = 0) -> dict[str, Any]:
    """In this process: warm up, reset the peak, train `steps` steps; report the peak, the
    times of the steps after the first and their median. The micro-batch packs samples of
    `sample_len` tokens (0: the model's `max_seq_len`)."""
    config = TrainerConfig.model_validate_json(trainer_json)
    device = torch.device("cuda" if config.device == "cuda" else "cpu")
    torch.set_num_threads(config.num_threads)
    # The warm-up model is built from fields, never from the run's folder (`path`).
    tiny = config.model.model_copy(update={"path": None, "dim": 64, "n_layers": 1, "ffn_dim": 64})
    tiny = tiny.model_copy(update={"n_heads": 2, "n_kv_heads": 1, "head_dim": None})
    warm = Trainer(config.model_copy(update={"model": tiny}), seed=0, device=device)
    warm_batch = _batch(min(tokens, tiny.max_seq_len), tiny.max_seq_len, tiny.vocab_size, 0)
    warm.train_step(1, [warm_batch.to(device)], "pg")
    del warm
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _rss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config, seed=0, device=device)
    args = config.model.decoder_args()
    batch = _batch(tokens, sample_len or args.max_seq_len, args.vocab_size, 1).to(device)
    times = []
    for step in range(1, steps + 1):
        start = time.perf_counter()
        trainer.train_step(step, [batch], "pg")
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    timed = times[1:] or times  # the first step allocates and faults in: not steady state
    result: dict[str, Any] = {
        "peak_bytes": float(_hwm_bytes() - base),
        "step_seconds": statistics.median(timed),
        "step_times": timed,
        "tokens": float(tokens),
    }
    if device.type == "cuda":
        result["cuda_max_allocated_bytes"] = float(torch.cuda.max_memory_allocated())
    return result


def measure(
    trainer_json: str, *, tokens: int, steps: int = 2, sample_len: int = 0, timeout: float = 600
) -> dict:
    """Run `run` in a fresh subprocess with the low mmap threshold; its result dict."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidal.trainer.memory_measure",
            trainer_json,
            str(tokens),
            str(steps),
            str(sample_len),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], *map(int, sys.argv[2:5]))))
