"""Trainer data-parallel scaling on CPU: tokens/s at world size 1 and 2 (FSDP2, gloo).

Both runs train the same model on the same global batch (world size 2 gives each rank
half of it), one thread per process, so ideal scaling doubles tokens/s:
efficiency_2 = tokens/s at 2 / (2 × tokens/s at 1). World size 2 runs twice: as the
trainer runs it (FSDP `reshard_after_forward = True`, blocks gathered again in backward)
and with `reshard_after_forward = False` (one all-gather per block and step fewer, more
memory): `efficiency_2_keep`. The variants run interleaved, ROUNDS times each in an order
that rotates every round (a load change on the shared machine then hits all of them),
and the medians are compared; the load average around each run is recorded, because on
a shared 2-core machine the 2-rank runs need both cores and suffer more from neighbours.
`cpu_efficiency_2` compares CPU seconds per step instead (the busier rank's at world
size 2; waiting is not counted, the collectives' copying is), which the neighbours' load
moves least. The communication share is the time the same collectives FSDP issues per
step (all-gather of every unit's parameters in forward, and again in backward when
resharding; the gradient reduce-scatter, done as on gloo by `apply_fsdp`) take when run
alone, in the same process group, divided by the step time: an upper bound on exposed
communication, since FSDP overlaps part of it with compute.

    python bench/scaling.py                      # every variant, writes scaling.json
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
GLOBAL_SAMPLES, SEQ, STEPS, WARMUP, ROUNDS = 8, 256, 4, 1, 3
# name → (world size, reshard_after_forward)
VARIANTS = {"ws1": (1, True), "ws2": (2, True), "ws2-keep": (2, False)}
COLLECTIVE_REPEATS = 10


def worker(out: str, reshard: bool) -> None:
    import torch
    import torch.distributed as dist

    from tidal.trainer.config import ModelConfig
    from tidal.trainer.models.factory import build_model
    from tidal.trainer.parallel.dims import ParallelDims
    from tidal.trainer.parallel.fsdp import apply_fsdp, fsdp_mesh, grad_sum_factor
    from tidal.trainer.parallel.runtime import leave_process_group

    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    rank, world = 0, 1
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
    batch = torch.randint(0, 259, (GLOBAL_SAMPLES, SEQ), generator=g)[rank::world]  # (S/ws, T)
    lengths = torch.full((len(batch),), SEQ)
    ids = batch.reshape(1, -1)  # (1, S/ws·T) packed
    positions = torch.arange(SEQ).repeat(len(batch))[None]
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, cpu_times = [], []
    for step in range(WARMUP + STEPS):
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
    if rank == 0:
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
    from tidal.trainer.parallel.runtime import leave_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, group = dist.get_world_size(), dist.group.WORLD
    from tidal.trainer.config import ModelConfig
    from tidal.trainer.models.factory import build_model

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


def run(variant: str, out: Path) -> dict:  # type: ignore[type-arg]
    world, reshard = VARIANTS[variant]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = [str(Path(__file__).resolve()), "--worker", str(out)]
    if not reshard:
        script.append("--keep-gathered")
    if world == 1:
        command = [sys.executable, *script]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
            *script,
        ]
    load_before = load_average()
    subprocess.run(command, check=True, env=env)
    return {**json.loads(out.read_text()), "load": (load_before + load_average()) / 2}


def main(collectives_only: bool = False) -> None:
    names = list(VARIANTS)
    runs: dict[str, list[dict]] = {name: [] for name in names}  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        collectives = run_collectives(Path(tmp) / "collectives.json")
        print_table("gloo gradient reduce-scatter, one block, 2 ranks (medians)", [collectives])
        if collectives_only:
            return
        for i in range(ROUNDS):
            for name in names[i % len(names) :] + names[: i % len(names)]:  # rotating order
                runs[name].append(run(name, Path(tmp) / f"{name}-{i}.json"))
    rows = []
    for name, results in runs.items():
        step_s = statistics.median(r["step_s"] for r in results)
        comm_s = statistics.median(r["comm_s"] for r in results)
        rows.append(
            {
                "variant": name,
                "world_size": VARIANTS[name][0],
                "reshard_after_forward": VARIANTS[name][1],
                "step_s": step_s,
                "tokens_per_s": GLOBAL_SAMPLES * SEQ / step_s,
                "step_cpu_s": statistics.median(r["step_cpu_s"] for r in results),
                "comm_share": comm_s / step_s,
                "load_avg": statistics.median(r["load"] for r in results),
                "params": results[0]["params"],
                "step_s_per_round": [round(r["step_s"], 3) for r in results],
            }
        )
    by_name = {row["variant"]: row for row in rows}
    single = by_name["ws1"]["tokens_per_s"]
    efficiency = by_name["ws2"]["tokens_per_s"] / (2 * single)
    efficiency_keep = by_name["ws2-keep"]["tokens_per_s"] / (2 * single)
    # CPU seconds per step: what the neighbours' load changes least (waiting is not
    # counted, the collectives' copying is). 1.0 = the 2 ranks do no extra work.
    cpu_efficiency = by_name["ws1"]["step_cpu_s"] / (2 * by_name["ws2"]["step_cpu_s"])
    shown = [
        {k: v for k, v in row.items() if k not in ("params", "step_s_per_round")} for row in rows
    ]
    print_table("Trainer scaling (FSDP2, gloo, 1 thread per process)", shown)
    print(
        f"efficiency_2 = {efficiency:.3f}, efficiency_2_keep = {efficiency_keep:.3f}, "
        f"cpu_efficiency_2 = {cpu_efficiency:.3f}"
    )
    path = write_result(
        "scaling",
        config={
            "model": MODEL,
            "global_samples": GLOBAL_SAMPLES,
            "seq_len": SEQ,
            "steps": STEPS,
            "rounds": ROUNDS,
            "variants": {k: {"world_size": w, "reshard": r} for k, (w, r) in VARIANTS.items()},
        },
        results=[*rows, {"variant": "collectives", **collectives}],
        summary={
            "efficiency_2": efficiency,
            "efficiency_2_keep": efficiency_keep,
            "cpu_efficiency_2": cpu_efficiency,
            "tokens_per_s_1": single,
            "tokens_per_s_2": by_name["ws2"]["tokens_per_s"],
            "comm_share_2": by_name["ws2"]["comm_share"],
            "load_avg": statistics.median(row["load_avg"] for row in rows),
            "gloo_reduce_scatter_over_all_reduce": collectives["ratio"],
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", metavar="OUT")
    parser.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward off")
    parser.add_argument("--collectives-worker", metavar="OUT")
    parser.add_argument(
        "--collectives-only", action="store_true", help="only the reduce-scatter comparison"
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, reshard=not args.keep_gathered)
    elif args.collectives_worker:
        collectives_worker(args.collectives_worker)
    else:
        main(collectives_only=args.collectives_only)
