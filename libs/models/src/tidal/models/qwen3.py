"""Qwen3 (dense): the Llama block with per-head RMSNorm of q and k (QK-norm) before RoPE.

Shared blocks (`layers.py`) with `qk_norm=True` and an explicit `head_dim` (Qwen3 configs
decouple it from hidden_size / heads); this module maps HF's `Qwen3ForCausalLM`.
"""

from __future__ import annotations

from typing import Any

from tidal.models.family import Family, Fields
from tidal.models.hf_config import common_from_hf, common_to_hf, refuse


def from_hf_config(config: dict[str, Any]) -> Fields:
    refuse(config, "attention_bias", False, "Qwen3 attention biases are not implemented")
    return {"family": "qwen3", "qk_norm": True, **common_from_hf(config)}


def to_hf_config(args: Fields) -> dict[str, Any]:
    return {
        **common_to_hf(args, model_type="qwen3", architecture="Qwen3ForCausalLM"),
        "attention_bias": False,
        "use_sliding_window": False,
    }


FAMILY = Family(
    name="qwen3",
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    from_hf_config=from_hf_config,
    to_hf_config=to_hf_config,
    qk_norm=True,
)
