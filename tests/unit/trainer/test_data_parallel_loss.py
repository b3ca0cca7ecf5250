"""The step loss is invariant to splitting micro-batches across ranks: 2 gloo ranks == 1 process.

Each rank trains on its own micro-batches with the step counts all-reduced (the `reduce`
of a `SingleProcess` rank context) and then all-reduces its gradients (SUM), as data
parallelism does; the result must equal one process training on all micro-batches, for
every normalization, with advantages varying per token.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData
from tidal.trainer.config import LossConfig, ModelConfig, TrainerConfig
from tidal.trainer.ranks import SingleProcess
from tidal.trainer.sft import pack_for_trainer
from tidal.trainer.torchrun_ranks import leave_process_group
from tidal.trainer.train_step import Trainer

TINY = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
NORMS = {
    "token": LossConfig(),
    "sequence": LossConfig(norm="sequence", ratio_level="sequence"),
    "constant": LossConfig(norm="constant", norm_constant=40.0, kl={"coef": 0.1}),  # type: ignore[arg-type]
    "off-policy": LossConfig.model_validate(
        {
            "objective": "decoupled",
            "tis_cap": 0.05,
            "trust_region": {"ratio_low": 0.005, "geo_ratio_low": 0.01},
        }
    ),
}


def step_batches() -> list[MicroBatchData]:
    """Five micro-batches of unequal size (rank 0 gets two, rank 1 three)."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for n_samples in (1, 3, 2, 1, 2):
        samples = []
        for _ in range(n_samples):
            n_prompt, n_completion = (int(x) for x in torch.randint(2, 9, (2,), generator=g))
            samples.append(
                TrainSample(
                    tuple(torch.randint(0, 256, (n_prompt,), generator=g).tolist()),
                    tuple(torch.randint(0, 256, (n_completion,), generator=g).tolist()),
                    advantage=float(torch.randn((), generator=g)),
                    completion_logprobs=tuple(
                        (-torch.rand(n_completion, generator=g) * 4).tolist()
                    ),
                    token_advantages=tuple(torch.randn(n_completion, generator=g).tolist()),
                )
            )
        batches.extend(pack_for_trainer(samples, 64))
    return batches


def gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def rank_main(out: Path) -> None:
    """Run as a gloo rank: compare sharded and single-process gradients, write the max error."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = step_batches()
    mine = batches[:2] if rank == 0 else batches[2:]
    errors = {}
    for name, loss in NORMS.items():
        config = TrainerConfig(model=TINY, loss=loss, device="cpu")
        counts_summed = SingleProcess(reduce=all_reduce_sum)
        sharded = Trainer(config, seed=0, device=torch.device("cpu"), ranks=counts_summed)
        metrics = sharded.compute_gradients(mine, "pg")
        grads = gradients(sharded)
        for g in grads.values():
            dist.all_reduce(g)
        loss_sum = all_reduce_sum(metrics["loss"].clone())
        single = Trainer(config, seed=0, device=torch.device("cpu"))
        expected_loss = single.compute_gradients(batches, "pg")["loss"]
        expected = gradients(single)
        errors[name] = {
            "loss": abs(float(loss_sum - expected_loss)),
            "grad": max(float((grads[k] - expected[k]).abs().max()) for k in expected),
            "scale": max(float(v.abs().max()) for v in expected.values()),
        }
    if rank == 0:
        out.write_text(json.dumps(errors))
    leave_process_group()


@pytest.mark.slow
@pytest.mark.distributed
def test_two_gloo_ranks_give_the_single_process_loss_and_gradients(tmp_path: Path) -> None:
    out = tmp_path / "errors.json"
    from tests.helpers.gloo_ranks import run_ranks  # not at the top: ranks run this file

    ranks = run_ranks([__file__, str(out)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert ranks.returncode == 0, ranks.output[-5000:]
    errors = json.loads(out.read_text())
    assert errors.keys() == NORMS.keys()
    for name, e in errors.items():
        assert e["loss"] < 1e-6, (name, e)
        assert e["grad"] < 1e-5 * max(1.0, e["scale"]), (name, e)


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]))
