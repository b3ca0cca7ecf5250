"""torch.compile per decoder block (`[trainer.model.compile]`).

Decisions:
- Each block is compiled on its own (`nn.Module.compile`, which keeps parameter names and
  the module tree): every block has the same structure, so one compiled graph serves all
  of them, compile time does not grow with depth, and FSDP can still wrap block by block.
  Compiling the whole model would trace the packed-attention mask and the LM head too.
- Applied after activation checkpointing (the checkpointed forward is traced, with its
  recomputation) and before sharding.
"""

from __future__ import annotations

from torch import nn

from tidal.trainer.memory.config import CompileConfig


def apply_compile(model: nn.Module, config: CompileConfig | None) -> int:
    """Compile every block of `model.model.layers` in place (None: nothing); returns blocks."""
    if config is None:
        return 0
    blocks = list(model.model.layers)  # type: ignore[union-attr,arg-type]
    for block in blocks:
        block.compile(backend=config.backend, fullgraph=config.fullgraph, dynamic=config.dynamic)
    return len(blocks)
