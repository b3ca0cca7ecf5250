"""Qwen2-MoE: Qwen2 attention (q/k/v biases), top-k experts plus a sigmoid-gated shared expert.

It exists to exercise the MoE block's optional shared expert against a reference; blocks
are shared (`layers.py`, `moe.py`), experts use the MoE state-dict adapter.
"""

from __future__ import annotations

from typing import Any

from tidal.models.family import Family, Fields
from tidal.models.hf_config import (
    common_from_hf,
    common_to_hf,
    moe_from_hf,
    moe_to_hf,
    refuse,
    require,
)


def from_hf_config(config: dict[str, Any]) -> Fields:
    refuse(config, "qkv_bias", True, "Qwen2-MoE without q/k/v biases is not implemented")
    return {
        "family": "qwen2_moe",
        "attention_bias": True,
        "shared_expert_ffn_dim": require(config, "shared_expert_intermediate_size"),
        **common_from_hf(config),
        **moe_from_hf(config),
    }


def to_hf_config(args: Fields) -> dict[str, Any]:
    return {
        **common_to_hf(args, model_type="qwen2_moe", architecture="Qwen2MoeForCausalLM"),
        **moe_to_hf(args),
        "shared_expert_intermediate_size": args["shared_expert_ffn_dim"],
        "qkv_bias": True,
        "use_sliding_window": False,
    }


FAMILY = Family(
    name="qwen2_moe",
    model_type="qwen2_moe",
    architecture="Qwen2MoeForCausalLM",
    from_hf_config=from_hf_config,
    to_hf_config=to_hf_config,
    moe=True,
    attention_bias=True,
)
