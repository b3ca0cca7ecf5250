"""Training each group's prompt once: one RL step with and without shared prompts.

Groups of one `--prompt`-token prompt and `--completions` × `--completion-len` tokens
(default 1,024 + 8 × 128), packed by the orchestrator's packer with `share_prompts` off
and on, each trained by the trainer's own `Trainer.train_step` from the same weights;
the variants alternate and s/step is the median. Rows, columns and shapes are
described in the results page beside its JSON (shared_prompt.md).

    python bench/shared_prompt.py [--shape small|large|both] [--device cpu|cuda]
                                  [--prompt 1024] [--completions 8] [--completion-len 128]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.train_step import Trainer

SHAPES = {
    "small": {"dim": 256, "n_layers": 4, "n_heads": 4, "ffn_dim": 1024},
    "large": {"dim": 512, "n_layers": 8, "n_heads": 8, "ffn_dim": 2048},
}
VOCAB = 264
HIDDEN = ("step_s_all", "params_m", "compute_dtype")  # in the JSON, not the table


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=(*SHAPES, "both"), default="both")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--budget", type=int, default=2048, help="micro-batch tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (trainer's)")
    return parser.parse_args(argv)


def step_samples(args: argparse.Namespace) -> list[TrainSample]:
    g = random.Random(0)
    samples = []
    for _ in range(args.groups):
        prompt = tuple(g.randrange(VOCAB) for _ in range(args.prompt))
        for _ in range(args.completions):
            n = args.completion_len
            samples.append(
                TrainSample(
                    prompt,
                    tuple(g.randrange(VOCAB) for _ in range(n)),
                    advantage=g.uniform(-1, 1),
                    completion_logprobs=tuple(-g.uniform(0.5, 6) for _ in range(n)),
                )
            )
    return samples


def batches(samples: list[TrainSample], budget: int, *, share: bool) -> list[MicroBatchData]:
    (packed,) = pack_for_ranks(samples, budget, 1, share_prompts=share)
    return [micro_batch_from_packed(p) for p in packed]


def measure_shape(shape: str, args: argparse.Namespace) -> list[dict[str, object]]:
    device = torch.device(args.device)
    model = ModelConfig(family="qwen2", vocab_size=VOCAB, max_seq_len=2048, tie_embeddings=True,
                        n_kv_heads=SHAPES[shape]["n_heads"], **SHAPES[shape])  # fmt: skip
    samples = step_samples(args)
    variants = {share: batches(samples, args.budget, share=share) for share in (False, True)}
    trainers = {
        share: Trainer(TrainerConfig(model=model, device=device.type), seed=0, device=device)
        for share in variants
    }
    first_loss = {}
    for share, trainer in trainers.items():  # warm-up; from the same weights: the same loss
        first_loss[share] = trainer.train_step(1, variants[share], "pg")["loss"]
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for share, trainer in trainers.items():
            started = time.perf_counter()
            trainer.train_step(trainer.trained_step + 1, variants[share], "pg")
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[share].append(time.perf_counter() - started)
            print(
                f"{shape} {'shared' if share else 'unshared'}: {times[share][-1]:.2f} s", flush=True
            )
    sample_tokens = sum(s.num_tokens for s in samples)
    unshared_s = statistics.median(times[False])
    rows = []
    for share in (False, True):
        seconds = statistics.median(times[share])
        rows.append(
            {
                "shape": shape,
                "layout": "shared" if share else "unshared",
                "micro_batches": len(variants[share]),
                "trained_tokens": sum(b.num_tokens for b in variants[share]),
                "s_per_step": seconds,
                "sample_tokens_per_s": sample_tokens / seconds,
                "speedup": unshared_s / seconds,
                "first_loss": first_loss[share],
                "step_s_all": [round(t, 4) for t in times[share]],
                "compute_dtype": "bf16" if trainers[share].bf16 else "fp32",
                "params_m": round(trainers[share].num_parameters / 1e6, 2),
            }
        )
    return rows


def main(argv: list[str]) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = list(SHAPES) if args.shape == "both" else [args.shape]
    rows = [row for shape in shapes for row in measure_shape(shape, args)]
    print_table(
        f"RL step, {args.groups} group(s) of prompt {args.prompt} + {args.completions} × "
        f"{args.completion_len}, {args.device} ({torch.get_num_threads()} threads)",
        [{k: v for k, v in row.items() if k not in HIDDEN} for row in rows],
    )
    summary = {
        f"speedup_{row['shape']}": round(float(row["speedup"]), 3)  # type: ignore[arg-type]
        for row in rows
        if row["layout"] == "shared"
    }
    name = "shared_prompt" if args.device == "cpu" else "shared_prompt.cuda"
    write_result(name, config=vars(args), results=rows, summary=summary)


if __name__ == "__main__":
    main(sys.argv[1:])
