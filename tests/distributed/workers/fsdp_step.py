"""Two AdamW steps on one fixed global batch, single-process or sharded (run by torchrun).

    python fsdp_step.py --modes single --out ref.pt
    torchrun --nproc-per-node 2 fsdp_step.py --modes fsdp,hsdp,fsdp-offload --out x.pt

Each data-parallel rank trains on its share of the samples (round-robin); the loss is the
token sum of its share divided by the *global* token count, so the sharded gradient must
equal the single-process gradient of the whole batch. Rank 0 saves the first step's full
gradients and the parameters after both steps.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tidal.trainer.config import ModelConfig
from tidal.trainer.model_factory import build_model
from tidal.trainer.parallel.dims import ParallelDims
from tidal.trainer.parallel.fsdp import apply_fsdp, fsdp_mesh, grad_sum_factor
from tidal.trainer.torchrun_ranks import leave_process_group

TINY = ModelConfig(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
SAMPLES, STEPS = 6, 2


def global_batch() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [
        torch.randint(0, 259, (int(torch.randint(5, 30, (), generator=g)),), generator=g)
        for _ in range(SAMPLES)
    ]


def packed_loss(model: torch.nn.Module, samples: list[torch.Tensor], total: int) -> torch.Tensor:
    """Sum of next-token NLL over `samples`, packed into one row, divided by `total`."""
    ids = torch.cat(samples)[None]  # (1, T)
    lengths = torch.tensor([len(s) for s in samples])
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])[None]  # (1, T)
    logits = model(ids, positions, sample_lengths=lengths)[0, :-1]  # (T-1, V)
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")  # (T-1,)
    last = torch.cumsum(lengths, 0) - 1  # a sample's last token predicts nothing
    keep = torch.ones_like(nll, dtype=torch.bool)
    keep[last[:-1]] = False
    return nll[keep].sum() / total


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train(mode: str) -> dict[str, dict[str, torch.Tensor]]:
    """Two steps in `mode` ("single", "fsdp", "hsdp", "fsdp-offload"); full grads and params."""
    rank, world, factor = 0, 1, 1
    model = build_model(TINY, seed=0)
    if mode != "single":
        rank, world = dist.get_rank(), dist.get_world_size()
        hsdp = mode == "hsdp"
        dims = ParallelDims.build(world_size=world, dp_replicate=world if hsdp else 1)
        mesh = fsdp_mesh(dims.build_mesh("cpu"), hsdp=hsdp)
        apply_fsdp(model, mesh, cpu_offload=mode == "fsdp-offload")
        factor = grad_sum_factor(mesh)
    samples = global_batch()
    total = sum(len(s) - 1 for s in samples)
    mine = samples[rank::world]
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    grads: dict[str, torch.Tensor] = {}
    for step in range(STEPS):
        optim.zero_grad()
        (packed_loss(model, mine, total) * factor).backward()
        if step == 0:
            grads = {n: full(p.grad) for n, p in model.named_parameters()}
        optim.step()
    return {"grads": grads, "params": {n: full(p) for n, p in model.named_parameters()}}


def main(run: Callable[[str], object] = train) -> None:
    """Run `run(mode)` for every `--modes` entry (one process group for all sharded
    modes) and save {mode: result} from rank 0 to `--out`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", required=True, help="comma-separated; 'single' runs alone")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    modes = args.modes.split(",")
    if modes != ["single"]:
        dist.init_process_group("gloo")
    results = {mode: run(mode) for mode in modes}
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(results, args.out)
    if dist.is_initialized():
        leave_process_group()


if __name__ == "__main__":
    main()
