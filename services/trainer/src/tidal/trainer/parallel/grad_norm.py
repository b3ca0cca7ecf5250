"""Gradient-norm clipping over parameters that live on different device meshes.

Decisions:
- Under expert parallelism the expert weights are DTensors on the expert mesh
  (dp_replicate, dp_shard_mod_ep, ep) and every other weight is a DTensor on FSDP's mesh;
  DTensor refuses to stack norms from two meshes, so `torch.nn.utils.clip_grad_norm_`
  over all parameters fails. Here the gradients are grouped by mesh, each group's norm is
  torch's `get_total_norm` made a plain tensor (`full_tensor`: the reduction over that
  mesh), the groups combine as the root of the summed squares, and torch's
  `clip_grads_with_norm_` scales each group's gradients by the one coefficient (torchtitan does
  the same for its EP meshes).
- With one group (no EP, or one process) the norm is that group's, unchanged, so plain
  FSDP keeps exactly the number `clip_grad_norm_` gave.
- L2 norm only (the trainer's `optim.max_grad_norm` is an L2 bound).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients in place to total L2 norm `max_norm`; returns the norm before
    clipping as a plain () tensor (the same on every rank)."""
    params = [p for p in parameters if p.grad is not None]
    groups: dict[object, list[torch.nn.Parameter]] = {}
    for p in params:
        key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
        groups.setdefault(key, []).append(p)
    norms = []
    for group in groups.values():
        grads = [p.grad for p in group]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)  # type: ignore[arg-type]
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # ()
    if not norms:
        return torch.zeros(())
    total = norms[0] if len(norms) == 1 else torch.stack(norms).square().sum().sqrt()
    for group in groups.values():  # one foreach per mesh: DTensor cannot mix them
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total
