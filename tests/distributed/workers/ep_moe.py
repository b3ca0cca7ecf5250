"""Expert parallelism vs the unsharded mixture of experts (torchrun, 2 ranks).

    torchrun --nproc-per-node 2 ep_moe.py --out results.pt

Every rank holds the same router and expert weights (seeded). The reference runs the
whole batch through every expert on one process. Under EP each rank routes its own half
of the tokens and owns half of the experts; outputs are gathered back in token order,
input gradients too, and each expert's weight gradient is taken from its owner.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tidal.trainer.parallel.ep import expert_parallel
from tidal.trainer.torchrun_ranks import leave_process_group

E, TOP_K, D, FFN, N = 8, 2, 16, 24, 40


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {
        "router": torch.randn(D, E, generator=g) * 0.5,
        "gate": torch.randn(E, D, FFN, generator=g) * 0.2,
        "up": torch.randn(E, D, FFN, generator=g) * 0.2,
        "down": torch.randn(E, FFN, D, generator=g) * 0.2,
        "x": torch.randn(N, D, generator=g),
    }


def route(x: torch.Tensor, router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(x @ router, dim=-1)  # (N, E)
    top, idx = probs.topk(TOP_K, dim=-1)  # (N, k)
    return idx, top / top.sum(-1, keepdim=True)


def grouped_experts(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):  # type: ignore[no-untyped-def]
    """SwiGLU experts over tokens grouped by expert: one matmul per expert, not per token."""

    def run(tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outs = []
        for e, chunk in enumerate(tokens.split(counts.tolist())):
            outs.append((F.silu(chunk @ gate[e]) * (chunk @ up[e])) @ down[e])
        return torch.cat(outs) if outs else tokens[:0]

    return run


def reference(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    params = {k: v.clone().requires_grad_() for k, v in w.items()}
    idx, top = route(params["x"], params["router"])
    out = torch.zeros_like(params["x"])
    for e in range(E):
        hit = idx == e  # (N, k)
        rows = hit.any(-1)
        expert = grouped_experts(
            params["gate"][e : e + 1], params["up"][e : e + 1], params["down"][e : e + 1]
        )
        y = expert(params["x"][rows], torch.tensor([int(rows.sum())]))
        out = out.index_add(0, rows.nonzero()[:, 0], y * (top * hit).sum(-1)[rows][:, None])
    (out.square().sum() / 2).backward()
    return {"out": out.detach(), **{f"grad_{k}": v.grad for k, v in params.items()}}


def sharded(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rank, ep = dist.get_rank(), dist.get_world_size()
    per = E // ep
    mine = slice(rank * per, (rank + 1) * per)
    params = {k: v.clone().requires_grad_() for k, v in w.items()}
    x = params["x"][rank::ep]  # this rank's tokens (data parallel)
    idx, top = route(x, params["router"])
    local = grouped_experts(params["gate"][mine], params["up"][mine], params["down"][mine])
    out = expert_parallel(x, idx, top, local, num_experts=E, group=dist.group.WORLD)
    (out.square().sum() / 2).backward()
    full = torch.empty(N, D)
    parts = [torch.empty(len(range(r, N, ep)), D) for r in range(ep)]
    dist.all_gather(parts, out.detach().contiguous())
    for r in range(ep):
        full[r::ep] = parts[r]
    grads = {}
    for k in ("x", "router"):  # replicated: sum the ranks' contributions
        g = params[k].grad.clone()
        dist.all_reduce(g)
        grads[f"grad_{k}"] = g
    for k in ("gate", "up", "down"):  # sharded: each expert's gradient from its owner
        parts = [torch.empty(per, *params[k].shape[1:]) for _ in range(ep)]
        dist.all_gather(parts, params[k].grad[mine].contiguous())
        grads[f"grad_{k}"] = torch.cat(parts)
    return {"out": full, **grads}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    w = weights()
    results = {"reference": reference(w), "ep": sharded(w)}
    if dist.get_rank() == 0:
        torch.save(results, args.out)
    leave_process_group()


if __name__ == "__main__":
    main()
