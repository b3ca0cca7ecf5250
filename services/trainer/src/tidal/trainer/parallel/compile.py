"""torch.compile per decoder block (`[trainer.model.compile]`).

Each block is compiled on its own (`nn.Module.compile` keeps names and the module tree):
the blocks share one structure, so one graph serves all, compile time does not grow with
depth and FSDP still wraps block by block. Applied after checkpointing, before sharding.
"""

from __future__ import annotations

from torch import nn

from tidal.trainer.memory_config import CompileConfig


def apply_compile(model: nn.Module, config: CompileConfig | None) -> int:
    """Compile every block of `model.model.layers` in place (None: nothing); returns blocks."""
    if config is None:
        return 0
    blocks = list(model.model.layers)  # type: ignore[union-attr,arg-type]
    for block in blocks:
        block.compile(backend=config.backend, fullgraph=config.fullgraph, dynamic=config.dynamic)
    return len(blocks)
