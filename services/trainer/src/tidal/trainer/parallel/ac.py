"""Activation checkpointing of decoder blocks: full (every `ac.freq`-th block) or selective.

Non-reentrant `torch.utils.checkpoint`, so it takes the non-tensor attention backend a
block gets and composes with activation offloading, FSDP2 and torch.compile. A
checkpointed module keeps its class and parameter names: its bound `forward` is replaced
on the instance (a wrapper module would prefix every name). "selective" is
module-level: only the named targets inside each block are recomputed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

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


def apply_ac(model: nn.Module, *, mode: str, freq: int, targets: Sequence[str]) -> int:
    """Checkpoint every `freq`-th block of `model.model.layers` ("full") or the `targets`
    inside each ("selective"), as `[trainer.model.ac]` says; returns modules wrapped."""
    wrapped = 0
    for i, block in enumerate(model.model.layers):  # type: ignore[union-attr,arg-type]
        if mode == "full":
            if i % freq == 0:
                checkpoint_module(block)
                wrapped += 1
        else:
            for module in _selective_targets(block, list(targets)):
                checkpoint_module(module)
                wrapped += 1
    return wrapped
