"""The real `Trainer` with expert parallelism (ep = 2, torchrun) vs one process.

    python trainer_ep.py --mode single --ckpt DIR --out ref.pt
    torchrun --nproc-per-node 2 trainer_ep.py --mode ranks --ckpt DIR --out x.pt
    torchrun --nproc-per-node 4 ...: the same as two HSDP replicas of ep = 2

A tiny Qwen3-MoE (4 experts, top-2, a noticeable aux-loss coefficient). ranks: each rank
holds 2 of the 4 experts per MoE block and gets its share of the step's micro-batches
as rank 0 would hand them (`assign_micro_batches`: three micro-batches, so one rank also
runs a zero-loss batch, whose tokens still travel through the all-to-all); every rank
calls the trainer directly (no control channel: the same collectives in the same order).
Recorded: step 1's full gradients and metric sums before any update, the metrics of two
optimizer steps, the full weights after each, and a DCP checkpoint after step 2.
single: the same in one process, plus a fresh trainer restored from the 2-rank checkpoint.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from tidal.trainer.batch import MicroBatchData
from tidal.trainer.checkpoint import CheckpointManager
from tidal.trainer.config import TrainerConfig
from tidal.trainer.train_step import Trainer

MODEL = {
    "family": "qwen3_moe",
    "dim": 32,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 8,
    "n_experts": 4,
    "n_experts_per_tok": 2,
    "moe_ffn_dim": 24,
    "max_seq_len": 64,
    "router_aux_loss_coef": 0.1,
}
SUMS = ("loss", "aux_loss", "expert_load_max", "expert_load_min", "entropy")


def config(world_size: int) -> TrainerConfig:
    """One process; ep over 2 ranks; or (4 ranks) two HSDP replicas of ep = 2 each."""
    parallel = {"ep": 2, "dp_replicate": world_size // 2} if world_size > 1 else {}
    return TrainerConfig.model_validate(
        {
            "model": MODEL,
            "world_size": world_size,
            "parallel": parallel,
            "optim": {"lr": 1e-2, "weight_decay": 0.1},
        }
    )


def step_batches(step: int) -> list[MicroBatchData]:
    from trainer_ranks import micro_batch  # the same packed micro-batches as trainer_ranks

    return [
        micro_batch([12, 7, 20], 10 * step),
        micro_batch([30], 10 * step + 1),
        micro_batch([5, 9], 10 * step + 2),
    ]


def full_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
        for name, p in trainer.model.named_parameters()
    }


def train(trainer: Trainer, share: list[list[MicroBatchData]]) -> dict[str, object]:
    """`share[step - 1]`: this rank's micro-batches of each step."""
    sums = trainer.compute_gradients(share[0], "pg")
    first = {"grads": full_grads(trainer), "sums": {k: float(sums[k]) for k in SUMS}}
    metrics, published = [], {}
    for step, batches in enumerate(share, start=1):
        metrics.append(trainer.train_step(step, batches, "pg"))
        published[step] = trainer.state_dict_for_publish()
    return {"first": first, "metrics": metrics, "published": published}


def run_single(ckpt: Path) -> dict[str, object]:
    trainer = Trainer(config(1), seed=0, device=torch.device("cpu"))
    result = train(trainer, [step_batches(1), step_batches(2)])
    resumed = Trainer(config(1), seed=0, device=torch.device("cpu"))
    CheckpointManager(ckpt, keep_last=1).load(resumed)
    result["restored"] = {"step": resumed.trained_step, "params": resumed.state_dict_for_publish()}
    return result


def run_ranks(ckpt: Path) -> dict[str, object] | None:
    from tidal.trainer.parallel.assign import assign_micro_batches
    from tidal.trainer.parallel.runtime import RankContext

    world = int(os.environ["WORLD_SIZE"])
    ranks = RankContext.init(config(world), "cpu")
    trainer = Trainer(config(world), seed=0, device=ranks.device, parallel=ranks)
    experts = trainer.model.model.layers[0].mlp.experts.gate_up_proj
    assert experts.to_local().shape[0] == 2, "each rank holds 2 of the 4 experts"
    share = [assign_micro_batches(step_batches(s), world)[ranks.rank] for s in (1, 2)]
    result = train(trainer, share)
    CheckpointManager(ckpt, keep_last=1).save(trainer)
    rank = ranks.rank
    ranks.close()
    return result if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["single", "ranks"], required=True)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = run_single(args.ckpt) if args.mode == "single" else run_ranks(args.ckpt)
    if result is not None:
        torch.save(result, args.out)


if __name__ == "__main__":
    main()
