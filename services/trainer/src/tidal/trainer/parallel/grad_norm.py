"""Gradient-norm clipping over parameters that live on different device meshes.

Under expert parallelism expert and dense gradients are DTensors on two meshes, whose
norms DTensor refuses to stack. Gradients are grouped by mesh, each group's L2 norm is
reduced over its mesh, the groups combine as the root of summed squares, and every group
is scaled by the one coefficient. With one group the norm is `clip_grad_norm_`'s exactly.
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
