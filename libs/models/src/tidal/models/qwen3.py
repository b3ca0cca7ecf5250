"""Qwen3 (dense): the Llama block with per-head RMSNorm of q and k (QK-norm) before RoPE.

The shared decoder with `qk_norm` and the explicit `head_dim` Qwen3 configs state
(decoupled from hidden_size / heads); maps HF's `Qwen3ForCausalLM`.
"""

from __future__ import annotations

from typing import Any

from tidal.models.hf_config import Fields, refuse


def from_hf(config: dict[str, Any]) -> Fields:
    refuse(config, "attention_bias", False, "Qwen3 attention biases are not implemented")
    return {}


def to_hf(args: Fields) -> dict[str, Any]:
    return {"attention_bias": False, "use_sliding_window": False}
