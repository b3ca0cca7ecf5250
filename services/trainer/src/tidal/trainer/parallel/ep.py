"""Expert parallelism: experts sharded over the EP group, tokens moved by all-to-all.

Decisions:
- The router stays replicated (every rank routes its own tokens); only experts are
  sharded: rank j of the EP group owns experts `[j·E/ep, (j+1)·E/ep)`.
- One dispatch/combine pair, independent of how experts compute: tokens are sorted by
  expert, token counts are exchanged first (a small integer all-to-all) so every rank
  knows its split sizes, the tokens travel with a differentiable all-to-all
  (`torch.distributed.nn.functional.all_to_all_single`, whose backward is the reverse
  all-to-all), are regrouped by local expert, computed, and travel back the same way.
  The combine weights by the router's weights and sums the top-k outputs per token.
- The local experts are any callable `(tokens (M, D), counts (E_local,)) -> (M, D)` over
  tokens grouped by expert, so the model's grouped expert computation is reused as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single

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
