"""Where a trainer step's time goes on a real model folder (SmolLM2-135M: 30 layers, 49K vocab).

The RL step of `rl_step.py --scenarios smollm2` driven in-process through the real
`Trainer`: 8 prompts of 45 tokens x 8 completions of 30-48 tokens, packed with shared
prompts into the orchestrator's default 2048-token micro-batches, random ids. Times are
CPU seconds of this process (`time.process_time`), so a loaded shared machine inflates
them less than wall time; the profiler's operators are grouped into what they compute
(decoder matmuls, LM head matmuls, LM head elementwise, attention, ...), each with its
share of the profiled step. The first step (optimizer build, warm-up) is left out.

`python bench/trainer_profile_real.py [--model-folder DIR] [--steps 2] [--threads 1]
[--zero-groups K]` (K of the 8 groups with advantage 0: the zero-advantage skip's A/B)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed
from tidal.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from tidal.trainer.train_step import Trainer

PROMPTS, COMPLETIONS, PROMPT_TOKENS, MAX_NEW = 8, 8, 45, 48


def batches(
    rng: random.Random, vocab: int, zero_groups: int = 0, budget: int = 2048
) -> list[MicroBatchData]:
    """The step's micro-batches; the first `zero_groups` groups have advantage 0 (equal rewards)."""
    samples = []
    for group in range(PROMPTS):
        prompt = tuple(rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS))
        for _ in range(COMPLETIONS):
            completion = tuple(rng.randrange(3, vocab) for _ in range(rng.randint(30, MAX_NEW)))
            samples.append(
                TrainSample(
                    prompt_ids=prompt,
                    completion_ids=completion,
                    advantage=0.0 if group < zero_groups else rng.gauss(0.0, 1.0),
                    completion_logprobs=tuple(-rng.uniform(1.0, 4.0) for _ in completion),
                )
            )
    (packed,) = pack_for_ranks(samples, budget, 1, share_prompts=True)
    return [micro_batch_from_packed(p) for p in packed]


def category(name: str, shapes: str, vocab: int) -> str:
    """What an operator (by name and input shapes) computes in the step."""
    head = str(vocab) in shapes
    if name in ("aten::mm", "aten::addmm", "aten::bmm"):
        return "LM head matmuls (forward, 2 backward)" if head else "decoder matmuls (bf16)"
    if head:
        return "LM head elementwise (fp32 cast, log-softmax, entropy, gather, weight cast)"
    if "scaled_dot_product" in name:
        return "attention (SDPA flash, forward + backward)"
    if "adamw" in name:
        return "AdamW (fused)"
    if name in ("aten::copy_", "aten::_to_copy"):
        return "dtype casts (autocast: weights and activations; grads back to fp32)"
    return "other elementwise (norms, SwiGLU, residuals, RoPE, grad accumulation)"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-folder", type=Path, default=Path("/work/smollm2-hf"))
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--zero-groups", type=int, default=0,
        help="groups of the 8 whose rewards are all equal (advantage 0); > 0 also times each "
        "step with trainer.loss.skip_zero_advantage off, alternating",
    )  # fmt: skip
    parser.add_argument(
        "--micro-batch-tokens", type=int, default=2048,
        help="token budget of each micro-batch (the orchestrator's default: 2048)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not (args.model_folder / "config.json").exists():  # `make bench` on a fresh clone
        print(f"skipped: no model folder at {args.model_folder} (`tidal import-model` writes one)")
        return
    torch.set_num_threads(args.threads)
    config = TrainerConfig(
        model=ModelConfig(path=args.model_folder),
        optim=OptimConfig(lr=3e-6),
        device="cpu",
        num_threads=args.threads,
    )
    trainer = Trainer(config, seed=0, device=torch.device("cpu"))
    skip_off = config.model_copy(update={"loss": config.loss.model_copy(
        update={"skip_zero_advantage": False})})  # fmt: skip
    modes = {"skip": config, "no skip": skip_off} if args.zero_groups else {"skip": config}
    vocab = config.model.vocab_size
    rng = random.Random(0)
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    tokens = skipped = 0
    step = 0
    for round_ in range(args.steps + 1):
        data = batches(rng, vocab, args.zero_groups, args.micro_batch_tokens)
        tokens = sum(b.num_tokens for b in data)
        for mode, mode_config in modes.items():  # the same batches, alternating
            trainer.config = mode_config
            step += 1
            started = time.process_time()
            metrics = trainer.train_step(step, data, "pg")
            if round_ > 0:
                cpu[mode].append(time.process_time() - started)
            if mode == "skip":
                skipped = int(metrics.get("zero_adv_skipped_tokens", 0))
    trainer.config = config
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        trainer.train_step(
            step + 1, batches(rng, vocab, args.zero_groups, args.micro_batch_tokens), "pg"
        )
    groups: dict[str, float] = {}
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key.startswith("aten::"):
            kind = category(e.key, str(e.input_shapes), vocab)
            groups[kind] = groups.get(kind, 0.0) + e.self_cpu_time_total
    total = sum(groups.values())
    rows: list[dict[str, Any]] = [
        {"what": kind, "share": us / total}
        for kind, us in sorted(groups.items(), key=lambda kv: -kv[1])
    ]
    started = time.process_time()
    trainer.state_dict_for_publish()
    publish_cpu = time.process_time() - started
    step_cpu = statistics.median(cpu["skip"])
    no_skip = {"step_cpu_s_skip_off": round(statistics.median(cpu["no skip"]), 2)} if (
        args.zero_groups) else {}  # fmt: skip
    print_table(
        f"trainer step, {trainer.describe()}, {tokens} tokens ({skipped} skipped), "
        f"bf16={trainer.bf16}, {step_cpu:.1f} CPU-s/step "
        f"({(tokens - skipped) / step_cpu:.0f} trained tokens per CPU-s) {no_skip}",
        rows,
    )
    write_result(
        "trainer_profile_real",
        config={
            "model": str(args.model_folder),
            "threads": args.threads,
            "bf16": trainer.bf16,
            "tokens_per_step": tokens,
            "zero_advantage_groups": args.zero_groups,
            "micro_batch_tokens": args.micro_batch_tokens,
            "skipped_tokens_per_step": skipped,
            "load_avg": list(os.getloadavg()),
        },
        results=rows,
        summary={
            "step_cpu_s": round(step_cpu, 2),
            "tokens_per_cpu_s": round((tokens - skipped) / step_cpu, 1),
            **no_skip,
            "publish_copy_cpu_s": round(publish_cpu, 3),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
