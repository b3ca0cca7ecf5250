"""Trainer data-parallel scaling on CPU: tokens/s at world size 1 and 2 (FSDP2, gloo).

Both runs train the same model on the same global batch (world size 2 gives each rank
half of it), one thread per process, so ideal scaling doubles tokens/s:
efficiency_2 = tokens/s at 2 / (2 × tokens/s at 1). The two world sizes are run
alternately, ROUNDS times each, and the medians compared. The communication share is the time
the same collectives FSDP issues per step (all-gather of every unit's parameters in
forward and again in backward, reduce-scatter of the gradients) take when run alone, in
the same process group, divided by the step time: an upper bound on exposed
communication, since FSDP overlaps part of it with compute.

    python bench/scaling.py            # parent: runs both world sizes with torchrun
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
GLOBAL_SAMPLES, SEQ, STEPS, WARMUP, ROUNDS = 8, 256, 4, 1, 2


def worker(out: str) -> None:
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
        apply_fsdp(model, mesh)
        factor = grad_sum_factor(mesh)
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 259, (GLOBAL_SAMPLES, SEQ), generator=g)[rank::world]  # (S/ws, T)
    lengths = torch.full((len(batch),), SEQ)
    ids = batch.reshape(1, -1)  # (1, S/ws·T) packed
    positions = torch.arange(SEQ).repeat(len(batch))[None]
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for step in range(WARMUP + STEPS):
        if distributed:
            dist.barrier()
        started = time.perf_counter()
        logits = model(ids, positions, sample_lengths=lengths)[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:]) * factor / world
        loss.backward()
        optim.step()
        optim.zero_grad()
        if distributed:
            dist.barrier()
        if step >= WARMUP:
            times.append(time.perf_counter() - started)
    step_s = statistics.median(times)
    comm_s = _collectives_seconds(model, world) if distributed else 0.0
    if rank == 0:
        Path(out).write_text(
            json.dumps({"world_size": world, "step_s": step_s, "comm_s": comm_s, "params": params})
        )
    if distributed:
        leave_process_group()


def _collectives_seconds(model, world: int) -> float:  # type: ignore[no-untyped-def]
    """Median time of one step's worth of FSDP collectives, issued alone."""
    import torch
    import torch.distributed as dist

    shard_numel = sum(p.to_local().numel() for p in model.parameters())
    local = torch.zeros(shard_numel)
    gathered = torch.zeros(shard_numel * world)
    times = []
    for _ in range(3):
        dist.barrier()
        started = time.perf_counter()
        for _ in range(2):  # forward and backward all-gathers (reshard after forward)
            dist.all_gather_single(gathered, local)
        dist.reduce_scatter_single(local, gathered)
        dist.barrier()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(world: int, out: Path) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = [str(Path(__file__).resolve()), "--worker", str(out)]
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
    subprocess.run(command, check=True, env=env)
    return json.loads(out.read_text())


def main() -> None:
    # Alternate the world sizes (1, 2, 1, 2, ...) and take medians per world size, so a
    # change in the shared machine's load hits both sides alike.
    runs: dict[int, list[dict]] = {1: [], 2: []}  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ROUNDS):
            for world in (1, 2):
                runs[world].append(run(world, Path(tmp) / f"ws{world}-{i}.json"))
    rows = []
    for world, results in runs.items():
        step_s = statistics.median(r["step_s"] for r in results)
        comm_s = statistics.median(r["comm_s"] for r in results)
        rows.append(
            {
                "world_size": world,
                "step_s": step_s,
                "tokens_per_s": GLOBAL_SAMPLES * SEQ / step_s,
                "comm_share": comm_s / step_s,
                "params": results[0]["params"],
                "step_s_per_round": [round(r["step_s"], 3) for r in results],
            }
        )
    efficiency = rows[1]["tokens_per_s"] / (2 * rows[0]["tokens_per_s"])
    print_table("Trainer scaling (FSDP2, gloo, 1 thread per process)", rows)
    print(f"efficiency_2 = {efficiency:.3f}")
    path = write_result(
        "scaling",
        config={
            "model": MODEL,
            "global_samples": GLOBAL_SAMPLES,
            "seq_len": SEQ,
            "steps": STEPS,
            "rounds": ROUNDS,
        },
        results=rows,
        summary={
            "efficiency_2": efficiency,
            "tokens_per_s_1": rows[0]["tokens_per_s"],
            "tokens_per_s_2": rows[1]["tokens_per_s"],
            "comm_share_2": rows[1]["comm_share"],
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", metavar="OUT")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
    else:
        main()
