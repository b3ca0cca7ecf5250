"""Qwen3-MoE: Qwen3 attention (QK-norm) with a top-k mixture-of-experts feed-forward.

Shared blocks: `models/layers.py` for attention and dense layers (`mlp_only_layers`,
`decoder_sparse_step`), `models/moe.py` for the router and grouped experts. This module
maps HF's `Qwen3MoeForCausalLM` config; `state_dict_adapter.py` splits/stacks experts.
"""

from __future__ import annotations

from typing import Any

from tidal.trainer.models.args import DecoderArgs
from tidal.trainer.models.family import Family
from tidal.trainer.models.hf_config import (
    common_from_hf,
    common_to_hf,
    moe_from_hf,
    moe_to_hf,
    refuse,
)
from tidal.trainer.models.layers import DecoderLM
from tidal.trainer.models.qwen3_moe.state_dict_adapter import MoEStateDictAdapter


class Qwen3MoeForCausalLM(DecoderLM):
    pass


def from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    refuse(config, "attention_bias", False, "Qwen3 attention biases are not implemented")
    return DecoderArgs(
        family="qwen3_moe", qk_norm=True, **common_from_hf(config), **moe_from_hf(config)
    )


def to_hf_config(args: DecoderArgs) -> dict[str, Any]:
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
    model_class=Qwen3MoeForCausalLM,
    adapter=MoEStateDictAdapter(),
)
