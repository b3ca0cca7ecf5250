"""torch.compile per decoder block (`[trainer.model.compile]`).

Each block is compiled on its own (`nn.Module.compile` keeps names and the module tree):
the blocks share one structure, so one graph serves all, compile time does not grow with
depth and FSDP still wraps block by block. Applied after checkpointing, before sharding.
Inductor's disk cache is kept per CPU capability (`cpu_features.inductor_cache_per_isa`).
"""

from __future__ import annotations

from torch import nn

from tidal.models.cpu_features import inductor_cache_per_isa


def apply_compile(model: nn.Module, *, backend: str, fullgraph: bool, dynamic: bool | None) -> int:
    """Compile every block of `model.model.layers` in place; returns blocks."""
    inductor_cache_per_isa()
    blocks = list(model.model.layers)  # type: ignore[union-attr,arg-type]
    for block in blocks:
        block.compile(backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    return len(blocks)
