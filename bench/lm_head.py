"""The chunked LM head lever: peak memory and time of logprobs + entropy, forward and backward.

One LM head of the size where logits dominate (4096 tokens per micro-batch, hidden 512,
vocab 32768, fp32), computing what the trainer needs (next-token logprobs and entropy)
and backpropagating a loss through both: the plain path (full `[T, V]` logits,
log-softmax, gather, entropy) against `memory/lm_head.py` at two chunk sizes.

Peak memory: each variant runs once in a fresh child process, which reports its peak
resident set size (ru_maxrss) minus its RSS just before the computation, i.e. what the
computation added on top of inputs and weights. Time: the parent times every variant in
one process, interleaved repeats, median; ratios are to the plain head.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_seconds, print_table, write_result

from tidal.trainer.memory.chunk_size import resolve_chunk_size
from tidal.trainer.memory.lm_head import chunked_logprobs_entropy

TOKENS, DIM, VOCAB = 4096, 512, 32768
VARIANTS = {"plain": None, "chunk auto": resolve_chunk_size("auto", VOCAB), "chunk 128": 128}
REPEATS = 3


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, DIM, generator=g, requires_grad=True)  # (T, D)
    weight = (torch.randn(VOCAB, DIM, generator=g) * 0.02).requires_grad_()  # (V, D)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=g)  # (T,)
    return hidden, weight, targets


def step(chunk: int | None, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
    hidden.grad = weight.grad = None
    if chunk is None:
        logprobs_all = torch.log_softmax(hidden @ weight.T, dim=-1)  # (T, V)
        logprobs = logprobs_all.gather(-1, targets[:, None]).squeeze(-1)  # (T,)
        entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)  # (T,)
    else:
        logprobs, entropy = chunked_logprobs_entropy(hidden, weight, targets, chunk=chunk)
    (-(logprobs.mean()) - 0.01 * entropy.mean()).backward()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def child(name: str) -> None:
    torch.set_num_threads(1)
    tensors = inputs()
    step(64, *tensors)  # warm up kernels with little memory
    before = rss_bytes()
    step(VARIANTS[name], *tensors)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"added_peak_bytes": peak - before}))


def main() -> None:
    torch.set_num_threads(1)
    peaks = {}
    for name in VARIANTS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", name], capture_output=True, text=True, check=True
        )
        peaks[name] = json.loads(out.stdout.strip().splitlines()[-1])["added_peak_bytes"]
    tensors = inputs()
    seconds = {name: [] for name in VARIANTS}
    for _ in range(REPEATS):  # interleaved, so drift and shared-CPU noise hit all alike
        for name, chunk in VARIANTS.items():
            seconds[name].append(median_seconds(lambda c=chunk: step(c, *tensors), repeats=1))
    rows = []
    plain_peak, plain_s = peaks["plain"], sorted(seconds["plain"])[REPEATS // 2]
    for name, chunk in VARIANTS.items():
        median = sorted(seconds[name])[REPEATS // 2]
        rows.append(
            {
                "variant": name,
                "chunk": chunk or TOKENS,
                "added peak MiB": peaks[name] / 2**20,
                "peak / plain": peaks[name] / plain_peak,
                "median s": median,
                "time / plain": median / plain_s,
            }
        )
    print_table(f"LM head, {TOKENS} tokens × vocab {VOCAB}, fp32, 1 thread", rows)
    write_result(
        "lm_head",
        config={"tokens": TOKENS, "dim": DIM, "vocab": VOCAB, "repeats": REPEATS},
        results=rows,
        summary={
            "auto_peak_fraction": rows[1]["peak / plain"],
            "auto_time_fraction": rows[1]["time / plain"],
        },
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
