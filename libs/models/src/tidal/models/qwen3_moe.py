"""Qwen3-MoE: Qwen3 attention (QK-norm) with a top-k mixture-of-experts feed-forward.

Shared blocks: `layers.py` for attention and dense layers (`mlp_only_layers`,
`decoder_sparse_step`), `moe.py` for the router and grouped experts. This module maps
HF's `Qwen3MoeForCausalLM` config; `state_dict_adapter.py` splits/stacks experts.
"""

from __future__ import annotations

from typing import Any

from tidal.models.family import Family, Fields
from tidal.models.hf_config import common_from_hf, common_to_hf, moe_from_hf, moe_to_hf, refuse


def from_hf_config(config: dict[str, Any]) -> Fields:
    refuse(config, "attention_bias", False, "Qwen3 attention biases are not implemented")
    return {"family": "qwen3_moe", "qk_norm": True, **common_from_hf(config), **moe_from_hf(config)}


def to_hf_config(args: Fields) -> dict[str, Any]:
    return {
        **common_to_hf(args, model_type="qwen3_moe", architecture="Qwen3MoeForCausalLM"),
        **moe_to_hf(args),
        "attention_bias": False,
        "use_sliding_window": False,
    }


FAMILY = Family(
    name="qwen3_moe",
    model_type="qwen3_moe",
    architecture="Qwen3MoeForCausalLM",
    from_hf_config=from_hf_config,
    to_hf_config=to_hf_config,
    moe=True,
    qk_norm=True,
)
