"""Activation checkpointing of decoder blocks: full (every `ac.freq`-th block) or selective.

Decisions:
- Non-reentrant `torch.utils.checkpoint` (saved-tensor hooks, so it accepts the
  non-tensor attention backend a block takes, composes with activation offloading and
  FSDP2, and traces under torch.compile).
- A checkpointed module keeps its class and its parameter names: its bound `forward`
  is replaced on the instance by one that runs the original through `checkpoint`. A
  wrapper module (torch's `checkpoint_wrapper`) would prefix every parameter name with
  `_checkpoint_wrapped_module.`, which publishing, loading and checkpoints would then
  have to strip again.
- "selective" is module-level: inside every block, only the named targets (norms,
  attention projections, the attention sub-block, the MLP) are recomputed; what the
  other ops save stays stored. torchtitan's op-level policy (save matmuls, recompute
  the rest) is the alternative; named modules are what the config can name.
- Order with the other levers (`apply_ac` → `apply_compile` → `apply_fsdp`) is the
  caller's; all three operate on `model.model.layers`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from tidal.trainer.memory.config import ActivationCheckpointConfig

NORMS = ("input_layernorm", "post_attention_layernorm")
ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_module(module: nn.Module) -> None:
    """Recompute `module`'s forward in backward; names and class stay as they were."""
    if getattr(module, "_tidal_checkpointed", False):
        return
    module.forward = functools.partial(_checkpointed, module.forward)  # type: ignore[method-assign]
    module._tidal_checkpointed = True  # type: ignore[assignment]


def _selective_targets(block: nn.Module, targets: list[str]) -> Iterator[nn.Module]:
    attn = block.get_submodule("self_attn")
    for target in targets:
        if target == "norm":
            yield from (getattr(block, name) for name in NORMS)
        elif target == "attn_proj":
            yield from (getattr(attn, name) for name in ATTN_PROJ)
        elif target == "attention":
            yield attn
        elif target == "mlp":
            yield block.get_submodule("mlp")
        else:  # the config's Literal makes this unreachable from TOML
            raise ValueError(f"unknown ac.targets entry {target!r}")


def apply_ac(model: nn.Module, config: ActivationCheckpointConfig | None) -> int:
    """Checkpoint `model.model.layers` per `config` (None: nothing); returns modules wrapped."""
    if config is None:
        return 0
    wrapped = 0
    for i, block in enumerate(model.model.layers):  # type: ignore[union-attr,arg-type]
        if config.mode == "full":
            if i % config.freq == 0:
                checkpoint_module(block)
                wrapped += 1
        else:
            for module in _selective_targets(block, list(config.targets)):
                checkpoint_module(module)
                wrapped += 1
    return wrapped
