"""Levers under FSDP2 (run by torchrun): checkpointing → compile → sharding gives the
single-process gradients of the plain model.

    python levers_fsdp.py --modes single --out ref.pt
    torchrun --nproc-per-node 2 levers_fsdp.py --modes ac-full,ac-selective-compile --out x.pt

The global batch, loss and split are those of `fsdp_step.py`; rank 0 saves the full
gradients of one backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_step import TINY, full, global_batch, main, packed_loss

from tidal.trainer.lever_config import ActivationCheckpointConfig, CompileConfig
from tidal.trainer.models.factory import build_model
from tidal.trainer.parallel.ac import apply_ac
from tidal.trainer.parallel.compile import apply_compile
from tidal.trainer.parallel.dims import ParallelDims
from tidal.trainer.parallel.fsdp import apply_fsdp, fsdp_mesh, grad_sum_factor

LEVERS = {
    "ac-full": (ActivationCheckpointConfig(mode="full"), None),
    "ac-selective-compile": (
        ActivationCheckpointConfig(mode="selective", targets=["attention", "mlp"]),
        CompileConfig(backend="aot_eager"),
    ),
}


def grads(mode: str) -> dict[str, torch.Tensor]:
    rank, world, factor = 0, 1, 1
    model = build_model(TINY, seed=0)
    if mode != "single":
        rank, world = dist.get_rank(), dist.get_world_size()
        ac, compile_config = LEVERS[mode]
        apply_ac(model, ac)  # the fixed order: checkpointing → compile → sharding
        apply_compile(model, compile_config)
        dims = ParallelDims.build(world_size=world)
        mesh = fsdp_mesh(dims.build_mesh("cpu"), hsdp=False)
        apply_fsdp(model, mesh)
        factor = grad_sum_factor(mesh)
    samples = global_batch()
    total = sum(len(s) - 1 for s in samples)
    (packed_loss(model, samples[rank::world], total) * factor).backward()
    return {n: full(p.grad) for n, p in model.named_parameters()}


if __name__ == "__main__":
    main(grads)
