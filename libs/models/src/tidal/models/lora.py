"""LoRA layers and merging: what a model with adapters is, and its merged / PEFT state dicts.

Here, with the model, because the trainer publishes merged weights and inference merges
published adapters with the same expression (`merge_update`); choosing targets is the
trainer's lever (`tidal.trainer.memory.lora`). `LoRALinear` takes over the original
layer's weight and bias Parameters, so base parameter names are unchanged for loading,
FSDP and the adapters. B starts at zero: the adapted model starts equal to the base.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PEFT_PREFIX = "base_model.model."


class LoRALinear(nn.Linear):
    """A linear layer with a trainable low-rank update on a frozen weight."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, dropout: float) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        kwargs: dict[str, Any] = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **kwargs))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, **kwargs))  # (out, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) → (..., out)
        base = F.linear(x, self.weight, self.bias)
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)  # (..., out)
        return base + self.scale * update

    def merged_weight(self) -> torch.Tensor:
        """(out, in) W + scale · B A."""
        return merge_update(self.weight, self.lora_A, self.lora_B, self.scale)


def merge_update(
    weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float
) -> torch.Tensor:
    """(out, in) W + scale · B A, for W (out, in), A (r, in), B (out, r).

    The one expression every merge uses (export, "merged" publishing, and inference
    merging published adapters), so all three give bit-identical weights.
    """
    return weight + scale * (lora_b @ lora_a)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict()` with every adapter folded into its weight and no adapter keys."""
    state = model.state_dict()
    for name, layer in lora_layers(model).items():
        state[f"{name}.weight"] = layer.merged_weight().detach()
        del state[f"{name}.lora_A"], state[f"{name}.lora_B"]
    return state


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters alone, PEFT-named, as detached CPU copies."""
    out: dict[str, torch.Tensor] = {}
    for name, layer in lora_layers(model).items():
        for part in ("lora_A", "lora_B"):
            tensor = getattr(layer, part).detach().to("cpu", copy=True)
            out[f"{PEFT_PREFIX}{name}.{part}.weight"] = tensor
    return out
