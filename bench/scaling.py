"""Trainer data-parallel scaling on CPU: tokens/s at world size 1 and 2 (FSDP2, gloo).

Both runs train the same model on the same global batch (world size 2 gives each rank
half of it), one thread per process, so ideal scaling doubles tokens/s:
efficiency_2 = tokens/s at 2 / (2 × tokens/s at 1). Measured at several global batch
sizes (`SAMPLES` × `SEQ` tokens), because communication grows with the parameters and
compute with tokens × parameters: the bigger the step, the smaller the comm share.
Variants per size:
- "ws1": one process on the whole batch; "ws2": 2 ranks as the trainer runs them
  (FSDP, `reshard_after_forward = True`); with `--keep`, also "ws2-keep"
  (`reshard_after_forward = False`: one all-gather per block and step fewer).
- "pair": the hardware ceiling. Two INDEPENDENT single processes at the same time, each
  on half the batch (no communication, no FSDP): ceiling_2 = tokens/s of the pair /
  (2 × tokens/s of ws1). What both cores busy costs against one (shared L3 and memory
  bandwidth, clocks); efficiency_2 / ceiling_2 is then what FSDP itself costs.
The runs are interleaved, ROUNDS times, in an order that rotates every round (a load
change on the shared machine then hits all of them), and the medians are compared; the
load average around each run is recorded. `cpu_efficiency_2` compares CPU seconds per
step instead (the busier rank's at world size 2; waiting is not counted, the
collectives' copying is). The communication share is the time the same collectives FSDP
issues per step (all-gather of every unit's parameters in forward, and again in backward
when resharding; the gradient reduce-scatter, done as on gloo by `apply_fsdp`) take when
run alone, in the same process group, divided by the step time: an upper bound on
exposed communication, since FSDP overlaps part of it with compute.

    python bench/scaling.py                      # every size and variant, writes scaling.json
    python bench/scaling.py --samples 8 --keep   # one size, with the ws2-keep variant
    python bench/scaling.py --collectives-only   # gloo reduce-scatter vs all-reduce only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import print_table, write_result  # noqa: E402

MODEL = {
    "dim": 512,
    "n_layers": 6,
    "n_heads": 8,
    "n_kv_heads": 4,
    "ffn_dim": 1408,
    "max_seq_len": 1024,
}
SEQ, STEPS, WARMUP, ROUNDS = 256, 2, 1, 3
# Global batches of 8, 16, 32 samples (2K, 4K, 8K tokens). The headline is the largest:
# 32 samples × 256 tokens is the small end of an RL step (16-64 samples × 256-1024).
SAMPLES = (8, 16, 32)
HEADLINE = 32
WARMUP_SAMPLES = 8  # the untimed first step (FSDP's lazy init, gloo's connections)
# name → (processes, reshard_after_forward); "pair" = 2 independent processes
VARIANTS = {"ws1": (1, True), "ws2": (2, True), "pair": (2, True), "ws2-keep": (2, False)}
COLLECTIVE_REPEATS = 10


def worker(out: str, *, samples: int, reshard: bool, half: int | None) -> None:
    """One run: `samples` × SEQ tokens per step over the ranks; `half` (0 or 1): an
    independent process training on that half of the batch (the "pair" variant)."""
    import torch
    import torch.distributed as dist

    from tidal.trainer.config import ModelConfig
    from tidal.trainer.model_factory import build_model
    from tidal.trainer.parallel.dims import ParallelDims
    from tidal.trainer.parallel.fsdp import apply_fsdp, fsdp_mesh, grad_sum_factor
    from tidal.trainer.torchrun_ranks import leave_process_group

    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    rank, world = (half, 2) if half is not None else (0, 1)
    model = build_model(ModelConfig(**MODEL), seed=0)
    params = sum(p.numel() for p in model.parameters())
    factor = 1
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        mesh = fsdp_mesh(ParallelDims.build(world_size=world).build_mesh("cpu"), hsdp=False)
        apply_fsdp(model, mesh, reshard_after_forward=reshard)
        factor = grad_sum_factor(mesh)
    g = torch.Generator().manual_seed(0)
    full = torch.randint(0, 259, (samples, SEQ), generator=g)
    warm = torch.randint(0, 259, (WARMUP_SAMPLES, SEQ), generator=g)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, cpu_times = [], []
    for step in range(WARMUP + STEPS):
        batch = (warm if step < WARMUP else full)[rank::world]  # (S/ws, T)
        lengths = torch.full((len(batch),), SEQ)
        ids = batch.reshape(1, -1)  # (1, S/ws·T) packed
        positions = torch.arange(SEQ).repeat(len(batch))[None]
        if distributed:
            dist.barrier()
        started, cpu_started = time.perf_counter(), time.process_time()
        logits = model(ids, positions, sample_lengths=lengths)[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:]) * factor / world
        loss.backward()
        optim.step()
        optim.zero_grad()
        cpu_s = time.process_time() - cpu_started  # this process's CPU, gloo's threads too
        if distributed:
            dist.barrier()
        if step >= WARMUP:
            times.append(time.perf_counter() - started)
            cpu_times.append(cpu_s)
    step_s = statistics.median(times)
    step_cpu_s = torch.tensor(statistics.median(cpu_times))
    if distributed:  # the busier rank's
        dist.all_reduce(step_cpu_s, op=dist.ReduceOp.MAX)
    comm_s = _collectives_seconds(model, world, 2 if reshard else 1) if distributed else 0.0
    if rank == 0 or not distributed:  # a "pair" half writes its own file
        Path(out).write_text(
            json.dumps(
                {
                    "world_size": world,
                    "step_s": step_s,
                    "step_cpu_s": float(step_cpu_s),
                    "comm_s": comm_s,
                    "params": params,
                }
            )
        )
    if distributed:
        leave_process_group()


def _collectives_seconds(model, world: int, gathers: int) -> float:  # type: ignore[no-untyped-def]
    """Median time of one step's worth of FSDP collectives, issued alone."""
    import torch
    import torch.distributed as dist

    from tidal.trainer.parallel.fsdp import AllReduceScatter

    reduce_scatter = AllReduceScatter()  # what apply_fsdp installs on gloo
    shard_numel = sum(p.to_local().numel() for p in model.parameters())
    local = torch.zeros(shard_numel)
    gathered = torch.zeros(shard_numel * world)
    times = []
    for _ in range(3):
        dist.barrier()
        started = time.perf_counter()
        for _ in range(gathers):  # forward (and with resharding, backward) all-gathers
            dist.all_gather_single(gathered, local)
        reduce_scatter(local, gathered, dist.group.WORLD, dist.ReduceOp.SUM)  # type: ignore[arg-type]
        dist.barrier()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def collectives_worker(out: str) -> None:
    """gloo's reduce_scatter_tensor vs all_reduce + copy (what apply_fsdp uses on gloo),
    interleaved, on one decoder block's gradient (the size FSDP reduces at once)."""
    import torch
    import torch.distributed as dist

    from tidal.trainer.parallel.fsdp import AllReduceScatter
    from tidal.trainer.torchrun_ranks import leave_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, group = dist.get_world_size(), dist.group.WORLD
    from tidal.trainer.config import ModelConfig
    from tidal.trainer.model_factory import build_model

    layer = build_model(ModelConfig(**MODEL), seed=0).model.layers[0]
    block = sum(p.numel() for p in layer.parameters())  # type: ignore[union-attr]
    full, shard = torch.randn(block - block % world), torch.empty(block // world)
    variants = {
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(shard, full),
        "all_reduce+copy": lambda: AllReduceScatter()(shard, full, group, dist.ReduceOp.SUM),  # type: ignore[arg-type]
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(COLLECTIVE_REPEATS):
        for name, fn in variants.items():
            dist.barrier()
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        medians = {name: statistics.median(t) for name, t in times.items()}
        Path(out).write_text(json.dumps({"numel": full.numel(), **medians}))
    leave_process_group()


def run_collectives(out: Path) -> dict:  # type: ignore[type-arg]
    script = [str(Path(__file__).resolve()), "--collectives-worker", str(out)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    load_before = load_average()
    subprocess.run([*command, *script], check=True, env=env)
    result = json.loads(out.read_text())
    return {
        "numel": result["numel"],
        "reduce_scatter_ms": 1000 * result["reduce_scatter_tensor"],
        "all_reduce_copy_ms": 1000 * result["all_reduce+copy"],
        "ratio": result["reduce_scatter_tensor"] / result["all_reduce+copy"],
        "load_avg": (load_before + load_average()) / 2,
    }


def load_average() -> float:
    """The 1-minute load average (how busy the shared machine is)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(variant: str, samples: int, out: Path) -> dict:  # type: ignore[type-arg]
    procs, reshard = VARIANTS[variant]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def script(out: Path) -> list[str]:
        flags = [] if reshard else ["--keep-gathered"]
        return [
            str(Path(__file__).resolve()),
            "--worker",
            str(out),
            "--samples",
            str(samples),
            *flags,
        ]

    load_before = load_average()
    if variant == "pair":  # two independent processes at once, each on half the batch
        outs = [out.with_suffix(f".{i}.json") for i in range(2)]
        halves = [
            subprocess.Popen([sys.executable, *script(o), "--half", str(i)], env=env)
            for i, o in enumerate(outs)
        ]
        if any(p.wait() for p in halves):
            raise RuntimeError("a pair half failed")
        results = [json.loads(o.read_text()) for o in outs]
        result = max(results, key=lambda r: r["step_s"])  # the pair is done when both are
        result["step_cpu_s"] = max(r["step_cpu_s"] for r in results)
    else:
        launcher = [sys.executable]
        if procs > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
        subprocess.run([*launcher, *script(out)], check=True, env=env)
        result = json.loads(out.read_text())
    return {**result, "load": (load_before + load_average()) / 2}


def summarise(samples: int, variant: str, results: list[dict]) -> dict:  # type: ignore[type-arg]
    """One (size, variant)'s row: medians over the rounds."""
    step_s = statistics.median(r["step_s"] for r in results)
    return {
        "samples": samples,
        "tokens": samples * SEQ,
        "variant": variant,
        "processes": VARIANTS[variant][0],
        "reshard_after_forward": VARIANTS[variant][1],
        "step_s": step_s,
        "tokens_per_s": samples * SEQ / step_s,
        "step_cpu_s": statistics.median(r["step_cpu_s"] for r in results),
        "comm_share": statistics.median(r["comm_s"] for r in results) / step_s,
        "load_avg": statistics.median(r["load"] for r in results),
        "params": results[0]["params"],
        "step_s_per_round": [round(r["step_s"], 3) for r in results],
    }


def size_summary(rows: dict[str, dict]) -> dict[str, float]:  # type: ignore[type-arg]
    """The ratios at one batch size (rows by variant)."""
    single = rows["ws1"]["tokens_per_s"]
    out = {
        "tokens": rows["ws1"]["tokens"],
        "efficiency_2": rows["ws2"]["tokens_per_s"] / (2 * single),
        "ceiling_2": rows["pair"]["tokens_per_s"] / (2 * single),
        # CPU seconds per step: what the neighbours' load changes least (waiting is not
        # counted, the collectives' copying is). 1.0 = the 2 ranks do no extra work.
        "cpu_efficiency_2": rows["ws1"]["step_cpu_s"] / (2 * rows["ws2"]["step_cpu_s"]),
        "comm_share_2": rows["ws2"]["comm_share"],
        "tokens_per_s_1": single,
        "tokens_per_s_2": rows["ws2"]["tokens_per_s"],
    }
    out["efficiency_over_ceiling"] = out["efficiency_2"] / out["ceiling_2"]
    if "ws2-keep" in rows:
        out["efficiency_2_keep"] = rows["ws2-keep"]["tokens_per_s"] / (2 * single)
    return out


def main(sizes: list[int], keep: bool, rounds: int, collectives_only: bool = False) -> None:
    names = [n for n in VARIANTS if keep or n != "ws2-keep"]
    runs = [(n, samples) for samples in sizes for n in names]
    results: dict[tuple[str, int], list[dict]] = {r: [] for r in runs}  # type: ignore[type-arg]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        collectives = run_collectives(Path(tmp) / "collectives.json")
        print_table("gloo gradient reduce-scatter, one block, 2 ranks (medians)", [collectives])
        if collectives_only:
            return
        for i in range(rounds):
            shift = i % len(names)  # rotate the variants' order within each size
            for samples in sizes:
                for name in names[shift:] + names[:shift]:
                    out = Path(tmp) / f"{name}-{samples}-{i}.json"
                    results[(name, samples)].append(run(name, samples, out))
    rows = [summarise(samples, name, results[(name, samples)]) for name, samples in runs]
    by_size = {
        samples: size_summary({r["variant"]: r for r in rows if r["samples"] == samples})
        for samples in sizes
    }
    columns = (
        "tokens",
        "variant",
        "step_s",
        "tokens_per_s",
        "step_cpu_s",
        "comm_share",
        "load_avg",
    )
    shown = [{k: r[k] for k in columns} for r in rows]
    print_table("Trainer scaling (FSDP2, gloo, 1 thread per process)", shown)
    print_table(
        "Per global batch (efficiency_2 = ws2 / 2·ws1, ceiling_2 = pair / 2·ws1)",
        [{k: round(v, 3) for k, v in row.items()} for row in by_size.values()],
    )
    headline = by_size[HEADLINE if HEADLINE in by_size else max(sizes)]
    load = statistics.median(r["load_avg"] for r in rows)
    path = write_result(
        "scaling",
        config={
            "model": MODEL,
            "seq_len": SEQ,
            "samples": sizes,
            "headline_samples": headline["tokens"] // SEQ,
            "steps": STEPS,
            "warmup_steps": WARMUP,
            "warmup_samples": WARMUP_SAMPLES,
            "rounds": rounds,
            "variants": {
                n: {"processes": VARIANTS[n][0], "reshard": VARIANTS[n][1]} for n in names
            },
        },
        results=[*rows, {"variant": "collectives", **collectives}],
        summary={
            **headline,
            "by_tokens": {str(v["tokens"]): v for v in by_size.values()},
            "load_avg": load,
            # More runnable work than cores: the wall-clock ratios then favour the
            # two-process variants (they get more of the scheduler's share) and swing
            # from run to run; only comm_share and the CPU-time ratios hold up.
            "oversubscribed": load > (os.cpu_count() or 1) + 0.5,
            "bench_minutes": (time.perf_counter() - started) / 60,
            "gloo_reduce_scatter_over_all_reduce": collectives["ratio"],
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", metavar="OUT")
    parser.add_argument(
        "--samples",
        type=int,
        nargs="+",
        default=list(SAMPLES),
        help="global batch sizes in samples of 256 tokens",
    )
    parser.add_argument("--half", type=int, choices=[0, 1], help="worker: a pair half")
    parser.add_argument("--keep", action="store_true", help="also the ws2-keep variant")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved repeats")
    parser.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward off")
    parser.add_argument("--collectives-worker", metavar="OUT")
    parser.add_argument(
        "--collectives-only", action="store_true", help="only the reduce-scatter comparison"
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, samples=args.samples[0], reshard=not args.keep_gathered, half=args.half)
    elif args.collectives_worker:
        collectives_worker(args.collectives_worker)
    else:
        main(args.samples, args.keep, args.rounds, collectives_only=args.collectives_only)
