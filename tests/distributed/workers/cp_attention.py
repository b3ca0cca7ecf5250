"""Ring and Ulysses context parallelism vs full attention on one packed row (torchrun).

    torchrun --nproc-per-node 2 cp_attention.py --out results.pt

Every rank builds the same tiny model and packed row (three samples of unequal length).
The reference is the ordinary single-process forward/backward over the whole row. Each
CP style then runs with the row sharded zigzag over the ranks; its logits are gathered
back into global order and its gradients summed over ranks. Rank 0 saves all of it.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from tidal.batch.tensors import segment_ids
from tidal.trainer.config import ModelConfig
from tidal.trainer.model_factory import build_model
from tidal.trainer.parallel.cp import RingAttention, UlyssesAttention, shard_indices
from tidal.trainer.torchrun_ranks import leave_process_group

TINY = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
LENGTHS = torch.tensor([11, 6, 15])  # T = 32: divisible by 2·cp for cp = 2 and 4


def row() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input ids, positions and segment ids of the packed row, each `(T,)`."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 259, (int(LENGTHS.sum()),), generator=g)
    positions = torch.cat([torch.arange(n) for n in LENGTHS.tolist()])
    return ids, positions, segment_ids(LENGTHS)


def nll_sum(
    logits: torch.Tensor, index: torch.Tensor, ids: torch.Tensor, seg: torch.Tensor
) -> torch.Tensor:
    """Next-token NLL summed over the tokens at global `index` whose successor is in the
    same sample. logits: `(len(index), V)`."""
    nxt = (index + 1).clamp(max=len(ids) - 1)
    valid = (index + 1 < len(ids)) & (seg[nxt] == seg[index])
    nll = torch.nn.functional.cross_entropy(logits, ids[nxt], reduction="none")
    return (nll * valid).sum()


def run(style: str | None) -> dict[str, object]:
    ids, positions, seg = row()
    total_pairs = int(sum(n - 1 for n in LENGTHS.tolist()))
    model = build_model(TINY, seed=0)
    if style is None:
        logits = model(ids[None], positions[None], sample_lengths=LENGTHS)[0]  # (T, V)
        (nll_sum(logits, torch.arange(len(ids)), ids, seg) / total_pairs).backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        return {"logits": logits.detach(), "grads": grads}
    rank, cp = dist.get_rank(), dist.get_world_size()
    index = torch.cat([shard_indices(len(ids), cp, r) for r in range(cp)])  # rank order
    mine = shard_indices(len(ids), cp, rank)
    backend_cls = RingAttention if style == "ring" else UlyssesAttention
    backend = backend_cls(dist.group.WORLD, index, seg)
    logits = model(ids[mine][None], positions[mine][None], attention=backend)[0]  # (T/cp, V)
    (nll_sum(logits, mine, ids, seg) / total_pairs).backward()
    grads = {}
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        grads[name] = p.grad
    parts = [torch.empty_like(logits) for _ in range(cp)]
    dist.all_gather(parts, logits.detach().contiguous())
    full = torch.empty(len(ids), logits.shape[-1])
    full[index] = torch.cat(parts)
    return {"logits": full, "grads": grads}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = {"reference": run(None), "ring": run("ring"), "ulysses": run("ulysses")}
    if dist.get_rank() == 0:
        torch.save(results, args.out)
    leave_process_group()


if __name__ == "__main__":
    main()
