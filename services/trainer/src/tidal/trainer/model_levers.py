"""Apply the model-side memory levers of `[trainer.model]` in their fixed order.

LoRA (swaps linear layers, so it precedes anything that wraps or traces them), then
activation checkpointing, then torch.compile; sharding (`parallel/fsdp.py`) comes after
all of them and is the caller's. Activation offloading and the chunked LM head act in
the training step, not on the module tree.
"""

from __future__ import annotations

from torch import nn

from tidal.common.errors import ConfigError
from tidal.trainer.config import ModelConfig
from tidal.trainer.memory.lora import apply_lora
from tidal.trainer.parallel.ac import apply_ac
from tidal.trainer.parallel.compile import apply_compile


def apply_model_levers(model: nn.Module, config: ModelConfig, *, seed: int) -> nn.Module:
    """LoRA → AC → compile on `model` in place; returns it (adapters drawn from `seed`)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if (config.ac is not None or config.compile is not None) and layers is None:
        raise ConfigError("trainer.model.ac / trainer.model.compile need decoder blocks")
    if config.fused_lm_head_token_chunk_size != "disabled" and not hasattr(model, "hidden_states"):
        raise ConfigError(
            "trainer.model.fused_lm_head_token_chunk_size needs our model implementation "
            '(model.impl = "custom"); this architecture runs on transformers'
        )
    apply_lora(model, config.lora, seed=seed)
    if config.ac is not None:
        apply_ac(model, **config.ac.model_dump())
    if config.compile is not None:
        apply_compile(model, **config.compile.model_dump())
    return model
