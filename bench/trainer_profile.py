"""Where one RL trainer step's time goes, phase by phase, on the small reversal shape.

The shape: a Qwen2-like model (hidden 256, 4 layers, ~4.2M parameters with the byte
vocabulary; `--large`: hidden 512 x 8 layers, ~33.6M), 8 prompts x 8 short completions in
one packed micro-batch. Each phase runs the code the trainer service runs: packing and
encoding, request decode, the step journal entry, forward / loss / backward / optimizer
(timers hooked onto the real code), the publish copy, the checkpoint and the version
folder, the response. A second table is the profiler's top operators by self CPU time.
Medians over `--steps` after warm-up, with each phase's share (steadier than absolute
times on a shared machine); `--attention padded|loop` with `--compare` sets two packed
attention kinds side by side in one process.

`python bench/trainer_profile.py [--large] [--threads N] [--steps N] [--compare]`
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

import tidal.models.layers as layers_module
import tidal.trainer.train_step as train_step_module
from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import TrainSample
from tidal.batch.tensors import micro_batch_from_packed, validate_micro_batch
from tidal.batch.wire import micro_batch_from_proto, micro_batch_to_proto, payload_sha256
from tidal.models.attention import PackedCausalAttention, PaddedCausalAttention
from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.persistence.journal import StepJournal
from tidal.trainer.train_step import Trainer
from tidal.weights.transports.base import VersionPayload
from tidal.weights.transports.filesystem import FilesystemSender

SMALL = {"dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 4, "ffn_dim": 1024}
LARGE = {"dim": 512, "n_layers": 8, "n_heads": 8, "n_kv_heads": 8, "ffn_dim": 2048}
PROMPTS, COMPLETIONS, MAX_NEW = 8, 8, 8
VOCAB = 264  # the byte tokenizer's
PHASES = (
    "pack + encode (orchestrator)",
    "request decode + validate",
    "payload sha256",
    "step journal entry (batch, fsync)",
    "forward (model, without attention)",
    "attention forward (packed)",
    "loss (logprobs, weights, rl_loss)",
    "backward",
    "clip + AdamW + schedule",
    "copy weights for publish",
    "checkpoint save (model + AdamW state, fsync)",
    "write version folder (encode, sha256, fsync)",
    "acknowledgement (TrainResponse)",
)


def model_config(shape: dict[str, int]) -> ModelConfig:
    return ModelConfig(
        family="qwen2", vocab_size=VOCAB, max_seq_len=128, tie_embeddings=True, **shape
    )


def step_samples(rng: random.Random) -> list[TrainSample]:
    """One step's 8 x 8 samples: BOS + 3-5 letters + '>' and 1-8 completion tokens."""
    samples = []
    for _ in range(PROMPTS):
        prompt = (1, *(rng.randrange(97, 105) for _ in range(rng.randint(3, 5))), 62)
        for _ in range(COMPLETIONS):
            completion = tuple(rng.randrange(3, VOCAB) for _ in range(rng.randint(1, MAX_NEW)))
            samples.append(
                TrainSample(
                    prompt_ids=prompt,
                    completion_ids=completion,
                    advantage=rng.gauss(0.0, 1.0),
                    completion_logprobs=tuple(-rng.uniform(4.0, 7.0) for _ in completion),
                )
            )
    return samples


class Timers:
    """Seconds per phase of the current step; `timed` wraps a function into a phase."""

    def __init__(self) -> None:
        self.now: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.now[name] += time.perf_counter() - started

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)

        return wrapper


def attention_backend(attention: str) -> type[PackedCausalAttention]:
    return PaddedCausalAttention if attention == "padded" else PackedCausalAttention


def hook_trainer(trainer: Trainer, timers: Timers, attention: str) -> None:
    """Time the model's forward, the attention backend inside it and the loss functions."""
    starts: list[float] = []
    trainer.model.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))

    def forward_done(*_: object) -> None:
        timers.now["forward"] += time.perf_counter() - starts.pop()

    trainer.model.register_forward_hook(forward_done)

    def backend(kind: Any, lengths: torch.Tensor, total: int) -> Any:
        return timers.timed(
            "attention forward (packed)", attention_backend(attention)(lengths, total)
        )

    layers_module.packed_attention = backend  # type: ignore[assignment]
    for name in ("rl_loss", "token_weights", "segment_ids"):
        original = getattr(train_step_module, name)
        setattr(train_step_module, name, timers.timed("loss fns", original))
    original_compute = trainer.compute_gradients
    trainer.compute_gradients = timers.timed("compute_gradients", original_compute)  # type: ignore[method-assign]


def one_step(
    trainer: Trainer,
    timers: Timers,
    rng: random.Random,
    sender: FilesystemSender,
    checkpoints: CheckpointManager,
    journal: StepJournal,
    step: int,
) -> dict[str, float]:
    timers.now.clear()
    samples = step_samples(rng)
    with timers.phase("pack + encode (orchestrator)"):
        (packed,) = pack_for_ranks(samples, trainer.config.model.max_seq_len * 16, 1)
        request = pb.TrainRequest(
            step=step,
            loss=pb.LOSS_KIND_POLICY_GRADIENT,
            micro_batches=[micro_batch_to_proto(p) for p in packed],
        )
        wire = request.SerializeToString()
    with timers.phase("request decode + validate"):
        received = pb.TrainRequest.FromString(wire)
        batches = []
        for i, message in enumerate(received.micro_batches):
            batch = micro_batch_from_packed(micro_batch_from_proto(message, field=f"mb[{i}]"))
            validate_micro_batch(batch, field=f"mb[{i}]", vocab_size=VOCAB, max_seq_len=128)
            batches.append(batch)
    with timers.phase("payload sha256"):
        sha = payload_sha256(received.loss, received.micro_batches)
    with timers.phase("step journal entry (batch, fsync)"):  # before the update, every step
        journal.append(step, batches, "pg", sha, covered_up_to=step - 1)
    with timers.phase("train_step"):
        metrics = trainer.train_step(step, batches, "pg")
    with timers.phase("copy weights for publish"):
        state = trainer.state_dict_for_publish()
    with timers.phase("checkpoint save (model + AdamW state, fsync)"):
        checkpoints.save(trainer)  # timed every step; by default due every 20th (journal)
    with timers.phase("write version folder (encode, sha256, fsync)"):
        sender.write(
            VersionPayload(version=step, step=step, state_dict=state, hf_config=trainer.hf_config())
        )
    with timers.phase("acknowledgement (TrainResponse)"):
        pb.TrainResponse(step=step, policy_version=step, metrics=metrics).SerializeToString()
    now = dict(timers.now)
    forward, attention = now.pop("forward"), now.pop("attention forward (packed)")
    loss = now.pop("loss fns")
    compute = now.pop("compute_gradients")
    # log-softmax/gather run between forward and rl_loss inside _target_logprobs: part of
    # compute_gradients' remainder that is not backward. Timed apart by the profiler table;
    # here the remainder of compute_gradients after forward and loss is backward.
    now["forward (model, without attention)"] = forward - attention
    now["attention forward (packed)"] = attention
    now["loss (logprobs, weights, rl_loss)"] = loss
    now["backward"] = compute - forward - loss
    now["clip + AdamW + schedule"] = now.pop("train_step") - compute
    return now


def profile(
    shape: dict[str, int],
    *,
    threads: int,
    steps: int,
    attention: str,
    precision: str = "fp32",
    seed: int = 0,
) -> tuple[dict[str, float], int, int]:
    """Median seconds per phase over `steps` steps; also the parameters and tokens per step."""
    torch.set_num_threads(threads)
    config = TrainerConfig(
        model=model_config(shape),
        optim=OptimConfig(lr=3e-4),
        device="cpu",
        num_threads=threads,
        precision=precision,
    )
    trainer = Trainer(config, seed=seed, device=torch.device("cpu"))
    timers = Timers()
    hook_trainer(trainer, timers, attention)
    rng = random.Random(seed)
    per_phase: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as root:
        sender = FilesystemSender(Path(root) / "weights", client=None)  # type: ignore[arg-type]
        checkpoints = CheckpointManager(Path(root) / "checkpoints", keep_last=2)
        journal = StepJournal(Path(root) / "checkpoints")
        for step in range(1, steps + 3):
            times = one_step(trainer, timers, rng, sender, checkpoints, journal, step)
            if step > 2:  # warm-up
                for name, seconds in times.items():
                    per_phase[name].append(seconds)
    tokens = sum(s.num_tokens for s in step_samples(random.Random(seed)))
    return {n: statistics.median(v) for n, v in per_phase.items()}, trainer.num_parameters, tokens


def op_table(
    shape: dict[str, int], *, threads: int, attention: str, precision: str = "fp32"
) -> list[dict[str, Any]]:
    """The profiler's top operators (self CPU) over 3 train steps after warm-up."""
    torch.set_num_threads(threads)
    config = TrainerConfig(
        model=model_config(shape), device="cpu", num_threads=threads, precision=precision
    )
    trainer = Trainer(config, seed=0, device=torch.device("cpu"))
    layers_module.packed_attention = lambda _, n, t: attention_backend(attention)(n, t)  # type: ignore[assignment]
    rng = random.Random(0)

    def batches() -> list[Any]:
        (packed,) = pack_for_ranks(step_samples(rng), 2048, 1)
        return [micro_batch_from_packed(p) for p in packed]

    for step in (1, 2):
        trainer.train_step(step, batches(), "pg")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in (3, 4, 5):
            trainer.train_step(step, batches(), "pg")
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        {
            "op": e.key,
            "calls_per_step": e.count // 3,
            "self_ms_per_step": e.self_cpu_time_total / 3 / 1e3,
            "share": e.self_cpu_time_total / total,
        }
        for e in events[:15]
    ]


def phase_rows(medians: dict[str, float]) -> list[dict[str, Any]]:
    total = sum(medians.values())
    return [
        {"phase": name, "ms": medians[name] * 1e3, "share": medians[name] / total}
        for name in PHASES
    ] + [{"phase": "total", "ms": total * 1e3, "share": 1.0}]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="hidden 512 x 8 layers (~33.6M)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (service default 1)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="trainer.precision"
    )
    parser.add_argument("--attention", choices=("padded", "loop"), default="padded")
    parser.add_argument(
        "--compare", action="store_true", help="also profile the other attention kind, interleaved"
    )
    args = parser.parse_args(argv)
    shape = LARGE if args.large else SMALL
    kinds = [args.attention] + (["loop" if args.attention == "padded" else "padded"] * args.compare)
    started = time.perf_counter()
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    rounds = 3 if args.compare else 1
    for _ in range(rounds):  # interleaved, so drift of the shared machine hits both alike
        for kind in kinds:
            medians, params, tokens = profile(
                shape,
                threads=args.threads,
                steps=args.steps,
                attention=kind,
                precision=args.precision,
            )
            runs[kind].append(medians)
    results: dict[str, Any] = {}
    for kind in kinds:
        medians = {n: statistics.median(r[n] for r in runs[kind]) for n in PHASES}
        rows = phase_rows(medians)
        print_table(
            f"one RL trainer step, {params / 1e6:.1f}M qwen2, {tokens} tokens in 64 samples, "
            f"{args.threads} thread(s), attention {kind}, {args.precision}",
            rows,
        )
        results[kind] = rows
    ops = op_table(shape, threads=args.threads, attention=args.attention, precision=args.precision)
    print_table(f"top operators, self CPU per step (attention {args.attention})", ops)
    total = {k: results[k][-1]["ms"] for k in kinds}
    summary: dict[str, Any] = {
        "step_ms": round(total[args.attention], 1),
        "model_arithmetic_share": round(
            sum(
                r["share"]
                for r in results[args.attention]
                if r["phase"].startswith(("forward", "attention", "backward", "loss", "clip"))
            ),
            3,
        ),
    }
    # What `trainer.background_publish` takes off the critical path (it overlaps the next
    # step's forward/backward instead): the checkpoint and the version folder.
    summary["checkpoint_and_publish_share"] = round(
        sum(
            r["share"]
            for r in results[args.attention]
            if r["phase"].startswith(("checkpoint", "write version"))
        ),
        3,
    )
    if args.compare:
        summary["loop_over_padded_step_ratio"] = round(total["loop"] / total["padded"], 3)
    write_result(
        "trainer_profile" + ("_large" if args.large else ""),
        config={
            "model": model_config(shape).model_dump(mode="json", exclude_defaults=True),
            "parameters": params,
            "tokens_per_step": tokens,
            "samples_per_step": PROMPTS * COMPLETIONS,
            "threads": args.threads,
            "precision": args.precision,
            "steps": args.steps,
            "rounds": rounds,
            "attention": kinds,
            "load_avg": list(__import__("os").getloadavg()),
            "wall_s": round(time.perf_counter() - started, 1),
        },
        results=[{"attention": k, **row} for k in kinds for row in results[k]]
        + [{"attention": args.attention, **op} for op in ops],
        summary=summary,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
