"""Optimizer-state offload under FSDP2 (run by torchrun) vs one process.

    python optim_state_offload_ranks.py --mode single --offloads none,cpu,disk \
        --ckpt DIR --out ref.pt
    torchrun --nproc-per-node 2 optim_state_offload_ranks.py --mode ranks --offloads cpu,disk \
        --ckpt DIR --out x.pt

ranks: for each offload kind, the real `Trainer` on 2 gloo ranks led by rank 0
(`TorchrunLeader`, as the service runs it) trains three policy-gradient steps of
`trainer_ranks.py`'s data with AdamW, saves a DCP checkpoint after step 2 and publishes
the full weights after every step. Then every rank builds a fresh trainer, restores the
checkpoint (as `tidal trainer --resume` does) and trains step 3 again. Each rank also
reports how many state elements its own store holds and which files it mapped.
single: the same three steps in one process for each kind ("none" = torch's AdamW), and,
for the offloaded kinds, a fresh one-process trainer restored from the 2-rank checkpoint
(resharded by DCP) that trains step 3.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from trainer_ranks import MODEL, step_batches

from tidal.trainer.config import TrainerConfig
from tidal.trainer.memory.optim_state_offload import DiskStateStore, OffloadedStateOptimizer
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.train_step import Trainer

STEPS = (1, 2, 3)
POOL_MB = 1 / 64  # a 16 KiB pool: the embedding's shard is updated in several slices


def config(world_size: int, offload: str, state_dir: Path) -> TrainerConfig:
    """AdamW with weight decay; `offload`: "none", "cpu" (host store) or "disk"."""
    # fused_adamw off: the one-process reference runs the same kernel as the shards, so
    # the comparison below stays bitwise (the fused kernel's own parity: test_optim.py).
    optim: dict[str, Any] = {
        "lr": 1e-2,
        "weight_decay": 0.1,
        "optim_offload_buffer_mb": POOL_MB,
        "fused_adamw": False,
    }
    if offload == "cpu":
        optim["optim_cpu_offload"] = True
    elif offload == "disk":
        optim |= {"optim_offload": "disk", "optim_offload_dir": str(state_dir)}
    return TrainerConfig.model_validate(
        {"model": MODEL, "world_size": world_size, "optim": optim, "device": "cpu"}
    )


def store_report(trainer: Trainer) -> dict[str, Any]:
    """Parameter elements this process updates, the fp32 elements its store holds per
    state kind (page-aligned regions), and its files if on disk."""
    optimizer = trainer.optimizer
    assert isinstance(optimizer, OffloadedStateOptimizer)
    store = optimizer.store
    params = [p for g in optimizer.param_groups for p in g["params"]]
    elements = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    if isinstance(store, DiskStateStore):
        files = sorted(store.dir.iterdir())
        capacity = files[0].stat().st_size // 4
    else:
        files, capacity = [], store.flat["exp_avg"].numel()
    return {"elements": elements, "capacity": capacity, "files": [str(f) for f in files]}


def run_single(ckpt: Path, offloads: list[str], state_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for offload in offloads:
        cfg = config(1, offload, state_dir / f"single-{offload}")
        trainer = Trainer(cfg, seed=0, device=torch.device("cpu"))
        metrics, published = [], {}
        for step in STEPS:
            metrics.append(trainer.train_step(step, step_batches(step), "pg"))
            published[step] = trainer.state_dict_for_publish()
        run: dict[str, Any] = {"metrics": metrics, "published": published}
        if offload != "none":
            run["store"] = store_report(trainer)
            trainer.optimizer.close()  # type: ignore[attr-defined]
            resumed = Trainer(cfg, seed=0, device=torch.device("cpu"))
            CheckpointManager(ckpt / offload, keep_last=2).load(resumed)  # 2 ranks → 1
            resumed.train_step(3, step_batches(3), "pg")
            run["resumed_at_one"] = resumed.state_dict_for_publish()
            resumed.optimizer.close()  # type: ignore[attr-defined]
        out[offload] = run
    return out


def lead_or_follow(
    trainer: Trainer, ranks: Any, ckpt: Path, steps: tuple[int, ...], save_after: int | None
) -> dict[str, Any] | None:
    """Rank 0 trains `steps` through `TorchrunLeader`; the others follow until it stops."""
    from tidal.trainer.leader import (
        ControlChannel,
        LeaderCheckpoints,
        TorchrunLeader,
        follow,
    )

    channel = ControlChannel(ranks)
    if ranks.rank != 0:
        follow(trainer, CheckpointManager(ckpt, keep_last=2), channel)
        return None
    leader = TorchrunLeader(trainer, channel)
    checkpoints = LeaderCheckpoints(ckpt, keep_last=2, channel=channel)
    metrics, published = [], {}
    for step in steps:
        metrics.append(leader.train_step(step, step_batches(step), "pg"))
        published[step] = leader.state_dict_for_publish()
        if step == save_after:
            checkpoints.save(leader)
    leader.stop()
    return {"metrics": metrics, "published": published}


def run_ranks(ckpt: Path, offloads: list[str], state_dir: Path) -> dict[str, Any] | None:
    from tidal.trainer.torchrun_ranks import TorchrunRanks

    ranks = TorchrunRanks.init(config(2, "none", state_dir), "cpu")
    out: dict[str, Any] = {}
    for offload in offloads:
        cfg = config(2, offload, state_dir / f"ranks-{offload}")
        trainer = Trainer(cfg, seed=0, device=ranks.device, ranks=ranks)
        stores: list[Any] = [None] * ranks.world_size
        dist.all_gather_object(stores, store_report(trainer), group=ranks.control)
        run = lead_or_follow(trainer, ranks, ckpt / offload, STEPS, save_after=2)
        trainer.optimizer.close()  # type: ignore[attr-defined]  # the resumed one remaps
        resumed = Trainer(cfg, seed=0, device=ranks.device, ranks=ranks)
        CheckpointManager(ckpt / offload, keep_last=2).load(resumed)  # every rank its shards
        again = lead_or_follow(resumed, ranks, ckpt / f"{offload}-unused", (3,), None)
        resumed.optimizer.close()  # type: ignore[attr-defined]
        if run is not None and again is not None:
            out[offload] = {**run, "stores": stores, "resumed": again["published"][3]}
    ranks.close()
    return out or None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["single", "ranks"], required=True)
    parser.add_argument("--offloads", required=True)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    offloads = args.offloads.split(",")
    state_dir = Path(args.out).parent / "states"
    if args.mode == "single":
        result = run_single(args.ckpt, offloads, state_dir)
    else:
        result = run_ranks(args.ckpt, offloads, state_dir)
    if result is not None:
        torch.save(result, args.out)


if __name__ == "__main__":
    main()
