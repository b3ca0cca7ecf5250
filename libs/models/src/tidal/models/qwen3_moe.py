"""Qwen3-MoE: Qwen3 attention (QK-norm) with a top-k mixture-of-experts feed-forward.

The shared decoder (`layers.py`; dense layers by `mlp_only_layers` and
`decoder_sparse_step`) with `moe.py`'s router and grouped experts; maps HF's
`Qwen3MoeForCausalLM`. `state_dict_adapter.py` splits and stacks the experts.
"""

from __future__ import annotations

from typing import Any

from tidal.models.hf_config import Fields, refuse


def from_hf(config: dict[str, Any]) -> Fields:
    refuse(config, "attention_bias", False, "Qwen3 attention biases are not implemented")
    return {}


def to_hf(args: Fields) -> dict[str, Any]:
    return {"attention_bias": False, "use_sliding_window": False}
