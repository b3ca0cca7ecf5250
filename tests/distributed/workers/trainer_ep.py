"""The real `Trainer` with expert parallelism (torchrun) vs one process.

    python trainer_ep.py --mode single --case CASE --out ref.pt [--restore DIR ...]
    torchrun --nproc-per-node N trainer_ep.py --mode ranks --case CASE --ckpt DIR --out x.pt

Cases (`LAYOUTS`, `MODELS`): "ep" = ep 2 over 2 ranks; "ep-hsdp" = 4 ranks as two HSDP
replicas of ep 2; "ep-2d" = 4 ranks, dp_shard 4 split into two EP groups of 2 (experts
sharded within a group, replicated across the groups); "ep-qwen2-ac" = ep 2 over 2 ranks
on a Qwen2-MoE (shared expert and its gate) with full activation checkpointing (the
all-to-alls run again in the recomputed forward). The single-process reference of a case
uses its model ("qwen3" or "qwen2-ac").

A tiny MoE (4 experts, top-2, a noticeable aux-loss coefficient). ranks: each rank holds
2 of the 4 experts per MoE block and gets its share of the step's micro-batches as rank
0 would hand them (`shares_by_rank`: three micro-batches, so at world size 4 one
rank runs only a zero-loss batch, whose tokens still travel through the all-to-all);
every rank calls the trainer directly (no control channel: the same collectives in the
same order). Recorded: step 1's full gradients and metric sums before any update, the
metrics of two optimizer steps, the full weights after each, and a DCP checkpoint after
step 2. single: the same in one process, plus a fresh trainer restored from each
`--restore` checkpoint (saved by the multi-rank runs).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from trainer_ranks import step_batches  # the same packed micro-batches as trainer_ranks

from tidal.batch.tensors import MicroBatchData
from tidal.trainer.config import TrainerConfig
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.train_step import Trainer

QWEN3 = {
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
QWEN2_AC = {
    **QWEN3,
    "family": "qwen2_moe",
    "shared_expert_ffn_dim": 20,
    "ac": {"mode": "full"},
}
# reference model → (model, AdamW lr). Adam divides each gradient element by its own
# magnitude, so an element whose gradient is near eps (qwen2's k_proj bias: ~1e-10, as
# attention barely depends on it) turns the ~1e-10 summation-order noise of the sharded
# sum into a weight difference of order lr × noise / eps; at lr 1e-2 that reached 1.1e-6
# on the Qwen2 model after two steps (every gradient within 1.2e-10), so it trains at
# 1e-3 to keep the 1e-6 bound meaningful.
MODELS = {"qwen3": (QWEN3, 1e-2), "qwen2-ac": (QWEN2_AC, 1e-3)}
# case → (reference model, trainer.parallel at its world size)
LAYOUTS: dict[str, tuple[str, dict[str, int]]] = {
    "ep": ("qwen3", {"ep": 2}),
    "ep-hsdp": ("qwen3", {"ep": 2, "dp_replicate": 2}),
    "ep-2d": ("qwen3", {"ep": 2, "dp_shard": 4}),
    "ep-qwen2-ac": ("qwen2-ac", {"ep": 2}),
}
SUMS = ("loss", "aux_loss", "expert_load_max", "expert_load_min", "entropy")


def config(model: str, world_size: int, parallel: dict[str, int]) -> TrainerConfig:
    spec, lr = MODELS[model]
    return TrainerConfig.model_validate(
        {
            "model": spec,
            "world_size": world_size,
            "parallel": parallel,
            "optim": {"lr": lr, "weight_decay": 0.1},
        }
    )


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


def run_single(model: str, restore: list[Path]) -> dict[str, object]:
    trainer = Trainer(config(model, 1, {}), seed=0, device=torch.device("cpu"))
    result = train(trainer, [step_batches(1), step_batches(2)])
    restored = {}
    for ckpt in restore:
        resumed = Trainer(config(model, 1, {}), seed=0, device=torch.device("cpu"))
        CheckpointManager(ckpt, keep_last=1).load(resumed)
        restored[ckpt.name] = {
            "step": resumed.trained_step,
            "params": resumed.state_dict_for_publish(),
        }
    result["restored"] = restored
    return result


def run_ranks(case: str, ckpt: Path) -> dict[str, object] | None:
    from tidal.trainer.parallel.assign import shares_by_rank
    from tidal.trainer.torchrun_ranks import TorchrunRanks

    world = int(os.environ["WORLD_SIZE"])
    model, parallel = LAYOUTS[case]
    cfg = config(model, world, parallel)
    ranks = TorchrunRanks.init(cfg, "cpu")
    trainer = Trainer(cfg, seed=0, device=ranks.device, ranks=ranks)
    experts = trainer.model.model.layers[0].mlp.experts.gate_up_proj
    assert experts.to_local().shape[0] == 2, "each rank holds 2 of the 4 experts"
    share = [shares_by_rank(step_batches(s, world), world)[ranks.rank] for s in (1, 2)]
    result = train(trainer, share)
    CheckpointManager(ckpt, keep_last=1).save(trainer)
    rank = ranks.rank
    ranks.close()
    return result if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["single", "ranks"], required=True)
    parser.add_argument("--case", required=True, help="a LAYOUTS key (ranks) or MODELS key")
    parser.add_argument("--ckpt", type=Path, help="ranks: where to save the checkpoint")
    parser.add_argument("--restore", type=Path, nargs="*", default=[], help="single: load")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.mode == "single":
        result = run_single(args.case, args.restore)
    else:
        result = run_ranks(args.case, args.ckpt)
    if result is not None:
        torch.save(result, args.out)


if __name__ == "__main__":
    main()
