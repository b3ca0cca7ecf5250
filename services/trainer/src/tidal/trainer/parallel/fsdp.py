"""FSDP2 (`fully_shard`) for the policy model: per block, then the root; HSDP on a 2-D mesh.

Each decoder block is its own unit, so only one block's full parameters exist at a time;
the root (embeddings, final norm, head, tied weights) is wrapped last. FSDP averages
gradients over its mesh while our losses are normalized by the global token count, so
each rank's loss is scaled by `grad_sum_factor` (gloo has no PREMUL_SUM). On gloo the
reduce-scatter is an all-reduce plus a copy of this rank's chunk (`AllReduceScatter`):
the same sum, cheaper there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

# The interface `FSDPModule.set_custom_reduce_scatter` takes; torch exports only the setter.
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from tidal.models.device import DTYPES


def fsdp_mesh(mesh: Any, *, hsdp: bool) -> Any:
    """The (sub)mesh FSDP shards over: 1-D for FSDP, 2-D (replicate, shard) for HSDP."""
    return mesh["dp_replicate", "dp_shard_cp"] if hsdp else mesh["dp_shard_cp"]


def apply_fsdp(
    model: nn.Module,
    mesh: Any,
    *,
    param_dtype: str = "float32",
    reduce_dtype: str = "float32",
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    ignored_params: set[nn.Parameter] | None = None,
) -> nn.Module:
    """Shard `model` in place (blocks, then root) and return it. `ignored_params` (the
    experts under expert parallelism, already sharded) are left as they are."""
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype]
    )
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else None
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": policy}
    if ignored_params:
        kwargs["ignored_params"] = ignored_params
    if offload is not None:
        kwargs["offload_policy"] = offload
    blocks = list(model.model.layers)  # type: ignore[union-attr,arg-type]
    for i, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward: keep them.
        fully_shard(
            block, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1, **kwargs
        )
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    if dist.get_backend(mesh.get_group(mesh.ndim - 1)) == "gloo":
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(AllReduceScatter())
    return model


class AllReduceScatter(ReduceScatter):
    """Reduce-scatter as all-reduce + copy of this rank's chunk (faster on gloo)."""

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,  # (n,) this rank's chunk
        input_tensor: torch.Tensor,  # (world · n,) FSDP's scratch buffer: reduced in place
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        dist.all_reduce(input_tensor, op=op, group=group)
        chunks = input_tensor.view(group.size(), -1)  # (world, n)
        output_tensor.view(-1).copy_(chunks[group.rank()])
        return None


def grad_sum_factor(mesh: Any) -> int:
    """What a rank's loss is multiplied by so FSDP's gradient average becomes a sum."""
    return int(mesh.size())
