"""Llama (2/3/3.1): GQA, RoPE with Llama 3's frequency scaling, RMSNorm, SwiGLU, tied or not.

The blocks are the shared ones in `layers.py`; this module is Llama's mapping to and from
Hugging Face's `LlamaForCausalLM` config. Dense: checkpoint names are our parameter names.
"""

from __future__ import annotations

from typing import Any

from tidal.models.family import Family, Fields
from tidal.models.hf_config import common_from_hf, common_to_hf, refuse


def from_hf_config(config: dict[str, Any]) -> Fields:
    refuse(config, "attention_bias", False, "Llama attention biases are not implemented")
    return {"family": "llama", **common_from_hf(config)}


def to_hf_config(args: Fields) -> dict[str, Any]:
    return {
        **common_to_hf(args, model_type="llama", architecture="LlamaForCausalLM"),
        "attention_bias": False,
        "mlp_bias": False,
    }


FAMILY = Family(
    name="llama",
    model_type="llama",
    architecture="LlamaForCausalLM",
    from_hf_config=from_hf_config,
    to_hf_config=to_hf_config,
)
