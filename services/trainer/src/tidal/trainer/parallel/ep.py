"""Expert parallelism: experts sharded over the EP group, tokens moved by all-to-all.

The router stays replicated; rank j of an EP group owns experts `[j·E/ep, (j+1)·E/ep)`
as DTensor shards, so the optimizer, publishing and DCP treat them like every other
parameter, and FSDP ignores them. One dispatch/combine pair moves routed tokens to their
experts' ranks and back through differentiable all-to-alls and reuses the model's
grouped expert compute. `finish_expert_grads` sums expert gradients over the ranks
holding the same experts, so replicated copies stay equal (docs/distributed.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single
from torch.distributed.tensor import DTensor, Replicate, Shard

from tidal.common.errors import ConfigError
from tidal.models.moe import MoEFeedForward

LocalExperts = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _by_local_expert(counts: torch.Tensor) -> torch.Tensor:
    """Permutation taking rows ordered (source rank, local expert) to (local expert,
    source rank). counts: `(ep, E_local)` rows received per source and local expert."""
    ep, local = counts.shape
    starts = torch.cumsum(counts.flatten(), 0) - counts.flatten()  # (ep·E_local,)
    starts = starts.view(ep, local)
    pieces = [
        torch.arange(int(starts[i, e]), int(starts[i, e] + counts[i, e]))
        for e in range(local)
        for i in range(ep)
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


def expert_parallel(
    x: torch.Tensor,  # (N, D) this rank's tokens
    expert_idx: torch.Tensor,  # (N, k) chosen experts (global ids)
    weights: torch.Tensor,  # (N, k) router weights
    local_experts: LocalExperts,
    *,
    num_experts: int,
    group: Any,
) -> torch.Tensor:  # (N, D)
    ep = dist.get_world_size(group)
    if num_experts % ep:
        raise ValueError(f"ep {ep} must divide the number of experts {num_experts}")
    n, k = expert_idx.shape
    per_rank = num_experts // ep
    flat_expert = expert_idx.flatten()  # (N·k,)
    token_of = torch.arange(n, device=x.device).repeat_interleave(k)  # (N·k,)
    order = torch.argsort(flat_expert, stable=True)
    routed = x[token_of[order]]  # (N·k, D) sorted by expert

    counts = torch.bincount(flat_expert, minlength=num_experts)  # (E,)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    received = received.view(ep, per_rank)  # (ep, E_local): from source i for my expert e
    send_splits = counts.view(ep, per_rank).sum(1).tolist()
    recv_splits = received.sum(1).tolist()

    arrived = all_to_all_single(
        routed.new_empty(sum(recv_splits), x.shape[1]),
        routed,
        output_split_sizes=recv_splits,
        input_split_sizes=send_splits,
        group=group,
    )  # (M, D) ordered (source, local expert)
    regroup = _by_local_expert(received)
    computed = torch.empty_like(arrived)
    computed[regroup] = local_experts(arrived[regroup], received.sum(0))  # back to (source, e)
    returned = all_to_all_single(
        routed.new_empty(routed.shape),
        computed,
        output_split_sizes=send_splits,
        input_split_sizes=recv_splits,
        group=group,
    )  # (N·k, D) sorted by expert, as sent
    per_choice = torch.empty_like(returned)
    per_choice[order] = returned  # (N·k, D) in (token, choice) order
    weighted = per_choice * weights.flatten()[:, None].to(per_choice.dtype)
    return torch.zeros_like(x).index_add(0, token_of, weighted)


def _moe_blocks(model: nn.Module) -> list[MoEFeedForward]:
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def check_expert_model(model: nn.Module, ep: int) -> None:
    """The built model can be split `ep` ways: it has MoE blocks and ep divides their
    experts. (Config validation checks the same from the config; a model loaded from
    `model.path` is only known here.)"""
    blocks = _moe_blocks(model)
    if not blocks:
        raise ConfigError(
            f"trainer.parallel.ep = {ep} needs a mixture-of-experts model, but the model "
            "has no MoE blocks"
        )
    if blocks[0].n_experts % ep:
        raise ConfigError(
            f"trainer.parallel.ep = {ep} must divide the model's n_experts = {blocks[0].n_experts}"
        )


def expert_mesh(mesh: Any) -> Any:
    """The submesh expert weights live on: (dp_replicate, dp_shard_mod_ep, ep)."""
    return mesh["dp_replicate", "dp_shard_mod_ep", "ep"]


def shard_experts(model: nn.Module, mesh: Any) -> set[nn.Parameter]:
    """Keep this rank's experts of every MoE block and route tokens to the others' (in place).

    `mesh`: the trainer's full mesh (ParallelDims.build_mesh); the EP group is its "ep"
    dimension. Returns the expert parameters, for FSDP to ignore.
    """
    experts_on = expert_mesh(mesh)
    placements = (Replicate(), Replicate(), Shard(0))  # replicated over edp, sharded over ep
    ep, index = mesh["ep"].size(), mesh["ep"].get_local_rank()
    group = mesh["ep"].get_group()
    sharded: set[nn.Parameter] = set()
    for block in _moe_blocks(model):
        per_rank = block.n_experts // ep
        for name, full in list(block.experts.named_parameters(recurse=False)):
            mine = full.detach()[index * per_rank : (index + 1) * per_rank].clone()  # (E/ep, ...)
            param = nn.Parameter(
                DTensor.from_local(mine, experts_on, placements, run_check=False),
                requires_grad=full.requires_grad,
            )
            setattr(block.experts, name, param)
            sharded.add(param)
        block.dispatch = functools.partial(
            expert_parallel, num_experts=block.n_experts, group=group
        )
    return sharded


def finish_expert_grads(model: nn.Module, mesh: Any, loss_scale: float) -> None:
    """Turn expert gradients into those of the global loss (after the step's backward).

    Each owner's gradient already sums its EP group's tokens, times `loss_scale`; the
    expert data-parallel ranks ("edp": other EP groups, HSDP replicas) own the same
    experts and saw other tokens: summed over them first.
    """
    edp = mesh["edp"]
    group = edp.get_group() if edp.size() > 1 else None
    for block in _moe_blocks(model):
        for param in block.experts.parameters(recurse=False):
            if param.grad is None:
                continue
            local = param.grad.to_local()  # (E/ep, ...) this rank's experts' gradient
            if group is not None:
                dist.all_reduce(local, group=group)
            local.div_(loss_scale)
