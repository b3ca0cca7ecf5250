"""Qwen2 / Qwen2.5: the Llama block with biases on the q, k and v projections.

Shared blocks (`layers.py`) with `attention_bias=True`; this module maps Hugging Face's
`Qwen2ForCausalLM` config. Sliding-window layers are refused (not implemented).
"""

from __future__ import annotations

from typing import Any

from tidal.models.family import Family, Fields
from tidal.models.hf_config import common_from_hf, common_to_hf


def from_hf_config(config: dict[str, Any]) -> Fields:
    return {"family": "qwen2", "attention_bias": True, **common_from_hf(config)}


def to_hf_config(args: Fields) -> dict[str, Any]:
    return {
        **common_to_hf(args, model_type="qwen2", architecture="Qwen2ForCausalLM"),
        "use_sliding_window": False,
    }


FAMILY = Family(
    name="qwen2",
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    from_hf_config=from_hf_config,
    to_hf_config=to_hf_config,
    attention_bias=True,
)
