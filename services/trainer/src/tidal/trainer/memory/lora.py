"""The LoRA lever: adapters on the targeted linears, the rest frozen (`[trainer.model.lora]`).

The layer and merging live in the model library (`tidal.models.lora`), shared with
inference; choosing targets and freezing is training policy, here. Targets match the
last component of a module name; one matching no `nn.Linear` is a `ConfigError`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tidal.common.errors import ConfigError
from tidal.models.lora import LoRALinear


def apply_lora(model: nn.Module, config: Any, *, seed: int = 0) -> list[str]:
    """Swap targeted linears for `LoRALinear` and freeze the rest; returns their names.

    `config` is a `LoRAConfig` (None: nothing); the adapters' initialization depends only
    on `seed`, not on the global RNG.
    """
    if config is None:
        return []
    targets = set(config.target_modules)
    chosen = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets
    ]
    found = {name.rsplit(".", 1)[-1] for name, _ in chosen}
    missing = sorted(targets - found)
    if missing:
        raise ConfigError(
            f"trainer.model.lora.target_modules: {missing} match no linear layer of the model "
            f"(linear layers are named {sorted(_linear_names(model))})"
        )
    if any(name == "lm_head" for name, _ in chosen):
        raise ConfigError("trainer.model.lora.target_modules: the LM head cannot take an adapter")
    model.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, module in chosen:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            lora = LoRALinear(module, rank=config.rank, alpha=config.alpha, dropout=config.dropout)
            setattr(parent, child, lora)
    return [name for name, _ in chosen]


def _linear_names(model: nn.Module) -> set[str]:
    return {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def adapter_config(config: Any) -> dict[str, Any]:
    """PEFT-style `adapter_config.json` fields of the published adapters (the publisher
    adds `base_version`, the version whose full weights they apply to)."""
    return {
        "peft_type": "LORA",
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": sorted(config.target_modules),
        "bias": "none",
    }
