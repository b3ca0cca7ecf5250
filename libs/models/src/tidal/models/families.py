"""The model families we implement, and choosing one by name or by a Hugging Face config.

A family is data, not a subclass: every family builds the one shared decoder
(`layers.DecoderLM`), so a `Family` is its Hugging Face names, the `DecoderArgs` switches
it turns on and the few `config.json` keys it fixes beyond the shared ones. `FAMILIES` is
the one list; `FamilyName` and `MOE_FAMILIES` derive from it. Torch-free and mapping plain
field dicts, so pydantic configs list the families without torch and `DecoderArgs`
delegates its HF mapping here without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tidal.models.hf_config import (
    Fields,
    common_from_hf,
    common_to_hf,
    moe_from_hf,
    moe_to_hf,
    refuse,
    require,
)


@dataclass(frozen=True)
class Family:
    name: str  # our id (`ModelConfig.family`, `DecoderArgs.family`) and HF's model_type
    architecture: str  # HF `config.json` architectures[0]
    moe: bool = False  # mixture-of-experts feed-forward (experts split/stacked on disk)
    attention_bias: bool = False  # biases on q/k/v projections (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    shared_expert: bool = False  # a sigmoid-gated shared expert beside the routed ones
    fixed: Fields = field(default_factory=dict, hash=False)
    """`config.json` keys of this family our blocks implement one value of: written with
    it, and a config with another value is refused."""

    def args_fields(self, config: dict[str, Any]) -> Fields:
        """`DecoderArgs` fields of a `config.json` of this family."""
        fields = {"family": self.name, "attention_bias": self.attention_bias}
        fields |= {"qk_norm": self.qk_norm, **common_from_hf(config)}
        if self.moe:
            fields |= moe_from_hf(config)
        for key, value in self.fixed.items():
            refuse(config, key, value, f"{self.architecture} is implemented with {value!r}")
        if self.shared_expert:
            fields["shared_expert_ffn_dim"] = require(config, "shared_expert_intermediate_size")
        return fields

    def hf_config(self, fields: Fields) -> dict[str, Any]:
        """The `config.json` of `DecoderArgs` fields of this family."""
        config = common_to_hf(fields, model_type=self.name, architecture=self.architecture)
        if self.moe:
            config |= moe_to_hf(fields)
        if self.shared_expert:
            config["shared_expert_intermediate_size"] = fields["shared_expert_ffn_dim"]
        return config | self.fixed


NO_BIAS = {"attention_bias": False, "use_sliding_window": False}
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", "LlamaForCausalLM", fixed={"attention_bias": False, "mlp_bias": False}),
        Family("qwen2", "Qwen2ForCausalLM", attention_bias=True,
               fixed={"use_sliding_window": False}),
        Family("qwen3", "Qwen3ForCausalLM", qk_norm=True, fixed=NO_BIAS),
        Family("qwen3_moe", "Qwen3MoeForCausalLM", moe=True, qk_norm=True, fixed=NO_BIAS),
        Family("qwen2_moe", "Qwen2MoeForCausalLM", moe=True, attention_bias=True,
               shared_expert=True, fixed={"qkv_bias": True, "use_sliding_window": False}),
    )
}  # fmt: skip
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)
# Literal of a runtime tuple: pydantic validates against exactly the registered names.
FamilyName = Literal[FAMILY_NAMES]  # type: ignore[valid-type]
MOE_FAMILIES: tuple[str, ...] = tuple(name for name, f in FAMILIES.items() if f.moe)


class UnsupportedArchitecture(ValueError):
    """The model folder or config names an architecture we have no implementation of."""


def supported_architectures() -> list[str]:
    return [f.architecture for f in FAMILIES.values()]


def family_of(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnsupportedArchitecture(
            f"unknown model family {name!r}; supported: {sorted(FAMILIES)}"
        ) from None


def family_for_hf_config(config: dict[str, Any]) -> Family:
    """The family of an HF `config.json`: by architectures[0] (what transformers uses),
    else by model_type; an unknown one is an error listing the supported ones."""
    architectures = config.get("architectures") or []
    for family in FAMILIES.values():
        if architectures and architectures[0] == family.architecture:
            return family
    model_type = config.get("model_type")
    for family in FAMILIES.values():
        if not architectures and model_type == family.name:
            return family
    named = architectures[0] if architectures else model_type
    raise UnsupportedArchitecture(
        f"unsupported architecture {named!r}; supported: {supported_architectures()}"
    )
