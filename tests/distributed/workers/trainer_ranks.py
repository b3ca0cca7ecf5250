"""The real `Trainer` as a torchrun job (rank 0 leads, rank 1 follows) vs one process.

    python trainer_ranks.py --mode single --ckpt DIR --out ref.pt
    torchrun --nproc-per-node 2 trainer_ranks.py --mode ranks --ckpt DIR --out x.pt

ranks: three policy-gradient steps on fixed micro-batches through `TorchrunLeader` (rank 0
hands rank 1 the micro-batch labelled for it over the control group; three micro-batches,
so rank 1 also runs a zero-loss batch), a DCP checkpoint after step 2, the full weights
published after steps 2 and 3. single: the same three steps in one process, and a fresh
single-process trainer restored from the 2-rank checkpoint, which then trains step 3 itself.
`--cp ring|ulysses`: the 2 ranks are one context-parallel group instead (both train every
micro-batch, each on its zigzag half of the tokens); `--cp hsdp`: two HSDP replicas.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.trainer.config import TrainerConfig
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.train_step import Trainer

MODEL = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 64, "max_seq_len": 64}


LOSS: dict[str, object] = {}
"""`--loss off-policy`: token-level corrections on, and micro-batches carry versions."""
OFF_POLICY = {
    "objective": "decoupled",
    "tis_cap": 0.2,
    "trust_region": {"ratio_low": 0.02, "ratio_high": 5.0},
}


def config(world_size: int, cp: str = "none") -> TrainerConfig:
    """`cp`: "none" (FSDP), "hsdp" (replicas), or a CP style ("ring", "ulysses")."""
    parallel: dict[str, object] = {}
    if cp == "hsdp":
        parallel = {"dp_replicate": world_size}
    elif cp != "none":
        parallel = {"cp": world_size, "cp_style": cp}
    return TrainerConfig.model_validate(
        {
            "model": MODEL,
            "world_size": world_size,
            "parallel": parallel,
            # the default kernel in one process too, so the comparison stays bitwise
            "optim": {"lr": 1e-2, "weight_decay": 0.1, "fused_adamw": False},
            "loss": LOSS,
        }
    )


def micro_batch(lengths: list[int], seed: int) -> MicroBatchData:
    """Random samples of `lengths` tokens, with advantages varying per token."""
    g = torch.Generator().manual_seed(seed)
    sample_lengths = torch.tensor(lengths)
    t = int(sample_lengths.sum())
    mask = torch.ones(t)
    mask[torch.cumsum(sample_lengths, 0) - sample_lengths] = 0  # no loss on first tokens
    return MicroBatchData(
        input_ids=torch.randint(0, 259, (t,), generator=g),
        position_ids=positions_for(sample_lengths),
        sample_lengths=sample_lengths,
        loss_mask=mask,
        advantages=torch.randn(t, generator=g),
        behaviour_logprobs=-torch.rand(t, generator=g) * 3 - 3,
    )


def step_batches(step: int, dp: int = 1) -> list[MicroBatchData]:
    """Three micro-batches, labelled round-robin over `dp` data-parallel ranks."""
    batches = [
        micro_batch([12, 7, 20], 10 * step),
        micro_batch([30], 10 * step + 1),
        micro_batch([5, 9], 10 * step + 2),
    ]
    if LOSS:  # every other micro-batch one version older: staleness 0 and 1 (-1 unknown)
        batches = [
            replace(b, policy_versions=torch.where(b.loss_mask > 0, step - 1 - i % 2, -1))
            for i, b in enumerate(batches)
        ]
    return [replace(b, rank=i % dp) for i, b in enumerate(batches)]


def run_single(ckpt: Path) -> dict[str, object]:
    trainer = Trainer(config(1), seed=0, device=torch.device("cpu"))
    metrics, published = [], {}
    for step in (1, 2, 3):
        metrics.append(trainer.train_step(step, step_batches(step), "pg"))
        published[step] = trainer.state_dict_for_publish()
    resumed = Trainer(config(1), seed=0, device=torch.device("cpu"))
    CheckpointManager(ckpt, keep_last=2).load(resumed)
    restored = {"step": resumed.trained_step, "params": resumed.state_dict_for_publish()}
    resumed.train_step(3, step_batches(3), "pg")
    restored["after_step_3"] = resumed.state_dict_for_publish()
    return {"metrics": metrics, "published": published, "restored": restored}


def run_ranks(ckpt: Path, cp: str) -> dict[str, object] | None:
    from tidal.trainer.leader import (
        ControlChannel,
        LeaderCheckpoints,
        TorchrunLeader,
        follow,
    )
    from tidal.trainer.torchrun_ranks import TorchrunRanks

    ranks = TorchrunRanks.init(config(2, cp), "cpu")
    trainer = Trainer(config(2, cp), seed=0, device=ranks.device, ranks=ranks)
    channel = ControlChannel(ranks)
    if ranks.rank != 0:
        follow(trainer, CheckpointManager(ckpt, keep_last=2), channel)
        ranks.close()
        return None
    leader = TorchrunLeader(trainer, channel)
    checkpoints = LeaderCheckpoints(ckpt, keep_last=2, channel=channel)
    metrics, published = [], {}
    for step in (1, 2, 3):
        metrics.append(leader.train_step(step, step_batches(step, ranks.dims.dp), "pg"))
        published[step] = leader.state_dict_for_publish()
        if step == 2:
            checkpoints.save(leader)
    leader.stop()
    ranks.close()
    return {"metrics": metrics, "published": published}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["single", "ranks"], required=True)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cp", choices=["none", "hsdp", "ring", "ulysses"], default="none")
    parser.add_argument("--loss", choices=["default", "off-policy"], default="default")
    args = parser.parse_args()
    if args.loss == "off-policy":
        LOSS.update(OFF_POLICY)
    torch.set_num_threads(1)
    result = run_single(args.ckpt) if args.mode == "single" else run_ranks(args.ckpt, args.cp)
    if result is not None:
        torch.save(result, args.out)


if __name__ == "__main__":
    main()
