"""Levers under FSDP2 (run by torchrun): checkpointing → compile → sharding, the chunked
LM head and activation offloading give the single-process loss and gradients of the plain
model.

    python levers_fsdp.py --modes single --out ref.pt
    torchrun --nproc-per-node 2 levers_fsdp.py --modes ac-full,chunked-head --out x.pt

The global batch and split are those of `fsdp_step.py`; the loss is its packed token NLL
minus an entropy bonus (so the chunked head's entropy gradient is exercised too). Rank 0
saves the full gradients of one backward and the global loss (summed over ranks).
"ac-offloading" copies every saved activation to host and back (`copy_on_cpu`, the CUDA
path's bookkeeping) while FSDP gathers and frees the blocks' parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_step import TINY, full, global_batch, main

from tidal.trainer.memory.activation_offload import activation_offloading
from tidal.trainer.memory.lm_head import chunked_logprobs_entropy
from tidal.trainer.memory_config import (
    ActivationCheckpointConfig,
    ActivationOffloadingConfig,
    CompileConfig,
)
from tidal.trainer.model_factory import build_model
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
    "chunked-head": (None, None),
    "ac-offloading": (None, None),
}
CHUNK = 7  # tokens per head chunk: several chunks, the last one partial
ENTROPY_COEF = 0.1


def loss_of(
    model: torch.nn.Module, samples: list[torch.Tensor], total: int, mode: str
) -> torch.Tensor:
    """(NLL - ENTROPY_COEF · entropy) summed over `samples`' scored tokens, / `total`."""
    ids = torch.cat(samples)[None]  # (1, T)
    lengths = torch.tensor([len(s) for s in samples])
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])[None]  # (1, T)
    targets = ids[0, 1:]  # (T-1,)
    if mode == "chunked-head":

        def head(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return chunked_logprobs_entropy(hidden[0, :-1], weight, targets, chunk=CHUNK)

        logprobs, entropy = model(ids, positions, sample_lengths=lengths, head=head)  # (T-1,)
    else:
        log_p = torch.log_softmax(model(ids, positions, sample_lengths=lengths)[0, :-1], -1)
        logprobs = log_p.gather(-1, targets[:, None]).squeeze(-1)  # (T-1,)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (T-1,)
    keep = torch.ones_like(logprobs, dtype=torch.bool)
    keep[(torch.cumsum(lengths, 0) - 1)[:-1]] = False  # a sample's last token predicts nothing
    return (-logprobs - ENTROPY_COEF * entropy)[keep].sum() / total


def grads(mode: str) -> dict[str, torch.Tensor]:
    rank, world, factor = 0, 1, 1
    model = build_model(TINY, seed=0)
    if mode != "single":
        rank, world = dist.get_rank(), dist.get_world_size()
        ac, compile_config = LEVERS[mode]
        if ac is not None:  # the fixed order: checkpointing → compile → sharding
            apply_ac(model, **ac.model_dump())
        if compile_config is not None:
            apply_compile(model, **compile_config.model_dump())
        dims = ParallelDims.build(world_size=world)
        mesh = fsdp_mesh(dims.build_mesh("cpu"), hsdp=False)
        apply_fsdp(model, mesh)
        factor = grad_sum_factor(mesh)
    samples = global_batch()
    total = sum(len(s) - 1 for s in samples)
    config = ActivationOffloadingConfig(min_offload_bytes=0) if mode == "ac-offloading" else None
    with activation_offloading(config, model, copy_on_cpu=True) as offloader:
        loss = loss_of(model, samples[rank::world], total, mode)
    assert config is None or offloader.handles, "activation offloading copied nothing"
    (loss * factor).backward()
    loss = loss.detach().clone()
    if dist.is_initialized():
        dist.all_reduce(loss)  # each rank's share → the global loss
    return {"loss": loss, **{n: full(p.grad) for n, p in model.named_parameters()}}


if __name__ == "__main__":
    main(grads)
