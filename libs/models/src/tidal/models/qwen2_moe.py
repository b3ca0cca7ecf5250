"""Qwen2-MoE: Qwen2 attention (q/k/v biases), top-k experts plus a sigmoid-gated shared expert.

It exercises the MoE block's optional shared expert against a reference; blocks are
shared (`layers.py`, `moe.py`), experts use the MoE state-dict adapter.
"""

from __future__ import annotations

from typing import Any

from tidal.models.hf_config import Fields, refuse, require


def from_hf(config: dict[str, Any]) -> Fields:
    refuse(config, "qkv_bias", True, "Qwen2-MoE without q/k/v biases is not implemented")
    return {"shared_expert_ffn_dim": require(config, "shared_expert_intermediate_size")}


def to_hf(args: Fields) -> dict[str, Any]:
    return {
        "shared_expert_intermediate_size": args["shared_expert_ffn_dim"],
        "qkv_bias": True,
        "use_sliding_window": False,
    }
