"""Llama (2/3/3.1): the shared decoder as it is (GQA, RoPE with Llama 3's frequency scaling,
RMSNorm, SwiGLU, tied or untied head).

Its `config.json` (`LlamaForCausalLM`) needs no key beyond the shared mapping; attention
biases are refused. Dense: checkpoint names are our parameter names.
"""

from __future__ import annotations

from typing import Any

from tidal.models.hf_config import Fields, refuse


def from_hf(config: dict[str, Any]) -> Fields:
    refuse(config, "attention_bias", False, "Llama attention biases are not implemented")
    return {}


def to_hf(args: Fields) -> dict[str, Any]:
    return {"attention_bias": False, "mlp_bias": False}
