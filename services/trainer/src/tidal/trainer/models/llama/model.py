"""Llama (2/3/3.1): GQA, RoPE with Llama 3's frequency scaling, RMSNorm, SwiGLU, tied or not.

The blocks are the shared ones in `models/layers.py`; this module is Llama's mapping to
and from Hugging Face's `LlamaForCausalLM` config. `LlamaArgs` and `rope_tables` stay
importable from here for the inference engine and older callers.
"""

from __future__ import annotations

from typing import Any

from tidal.trainer.models.args import DecoderArgs
from tidal.trainer.models.family import Family
from tidal.trainer.models.hf_config import common_from_hf, common_to_hf, refuse
from tidal.trainer.models.layers import DecoderLM, token_logprobs
from tidal.trainer.models.llama.state_dict_adapter import LlamaStateDictAdapter
from tidal.trainer.models.rope import apply_rope, rope_tables

LlamaArgs = DecoderArgs

__all__ = ["FAMILY", "LlamaArgs", "LlamaForCausalLM", "apply_rope", "rope_tables", "token_logprobs"]


class LlamaForCausalLM(DecoderLM):
    """Any `DecoderArgs` builds; the name is kept for callers typed against it."""


def from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    refuse(config, "attention_bias", False, "Llama attention biases are not implemented")
    return DecoderArgs(family="llama", **common_from_hf(config))


def to_hf_config(args: DecoderArgs) -> dict[str, Any]:
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
    adapter=LlamaStateDictAdapter(),
    model_class=LlamaForCausalLM,
)
