"""Qwen2 / Qwen2.5: the Llama block with biases on the q, k and v projections.

The shared decoder with `attention_bias`; HF's `Qwen2ForCausalLM` config maps through the
shared keys. Sliding-window layers are refused (not implemented).
"""

from __future__ import annotations

from typing import Any

from tidal.models.hf_config import Fields


def from_hf(config: dict[str, Any]) -> Fields:
    return {}


def to_hf(args: Fields) -> dict[str, Any]:
    return {"use_sliding_window": False}
