"""Qwen3 (dense): the Llama block with per-head RMSNorm of q and k (QK-norm) before RoPE.

Shared blocks (`models/layers.py`) with `qk_norm=True` and an explicit `head_dim` (Qwen3
configs decouple it from hidden_size / heads); this module maps HF's `Qwen3ForCausalLM`.
"""

from __future__ import annotations

from typing import Any

from tidal.trainer.models.args import DecoderArgs
from tidal.trainer.models.family import Family
from tidal.trainer.models.hf_config import common_from_hf, common_to_hf, refuse
from tidal.trainer.models.layers import DecoderLM
from tidal.trainer.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter


class Qwen3ForCausalLM(DecoderLM):
    pass


def from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    refuse(config, "attention_bias", False, "Qwen3 attention biases are not implemented")
    return DecoderArgs(family="qwen3", qk_norm=True, **common_from_hf(config))


def to_hf_config(args: DecoderArgs) -> dict[str, Any]:
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
    adapter=Qwen3StateDictAdapter(),
    model_class=Qwen3ForCausalLM,
)
