"""Qwen2 / Qwen2.5: the Llama block with biases on the q, k and v projections.

Shared blocks (`models/layers.py`) with `attention_bias=True`; this module maps Hugging
Face's `Qwen2ForCausalLM` config. Sliding-window layers are refused (not implemented).
"""

from __future__ import annotations

from typing import Any

from tidal.trainer.models.args import DecoderArgs
from tidal.trainer.models.family import Family
from tidal.trainer.models.hf_config import common_from_hf, common_to_hf
from tidal.trainer.models.layers import DecoderLM
from tidal.trainer.models.qwen2.state_dict_adapter import Qwen2StateDictAdapter


class Qwen2ForCausalLM(DecoderLM):
    pass


def from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    return DecoderArgs(family="qwen2", attention_bias=True, **common_from_hf(config))


def to_hf_config(args: DecoderArgs) -> dict[str, Any]:
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
    adapter=Qwen2StateDictAdapter(),
    model_class=Qwen2ForCausalLM,
)
