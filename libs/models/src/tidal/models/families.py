"""The model families we implement, and choosing one by name or by a Hugging Face config.

A family is data, not a subclass: every family builds the one shared decoder
(`layers.DecoderLM`), so a `Family` is its Hugging Face names, the `DecoderArgs` switches
it turns on and the few `config.json` keys it maps beyond the shared ones (its module,
`tidal/models/<family>.py`). `FAMILIES` is the one list; `FamilyName` and `MOE_FAMILIES`
derive from it. Torch-free and mapping plain field dicts, so pydantic configs list the
families without torch and `DecoderArgs` delegates its HF mapping here without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tidal.models import llama, qwen2, qwen2_moe, qwen3, qwen3_moe
from tidal.models.hf_config import Fields, common_from_hf, common_to_hf, moe_from_hf, moe_to_hf


@dataclass(frozen=True)
class Family:
    name: str  # our id (`ModelConfig.family`, `DecoderArgs.family`) and HF's model_type
    architecture: str  # HF `config.json` architectures[0]
    from_hf: Callable[[dict[str, Any]], Fields]  # the family's own config.json keys → fields
    to_hf: Callable[[Fields], dict[str, Any]]  # fields → the family's own config.json keys
    moe: bool = False  # mixture-of-experts feed-forward (experts split/stacked on disk)
    attention_bias: bool = False  # biases on q/k/v projections (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)

    def args_fields(self, config: dict[str, Any]) -> Fields:
        """`DecoderArgs` fields of a `config.json` of this family."""
        fields = {"family": self.name, "attention_bias": self.attention_bias}
        fields |= {"qk_norm": self.qk_norm, **common_from_hf(config)}
        if self.moe:
            fields |= moe_from_hf(config)
        return fields | self.from_hf(config)

    def hf_config(self, fields: Fields) -> dict[str, Any]:
        """The `config.json` of `DecoderArgs` fields of this family."""
        config = common_to_hf(fields, model_type=self.name, architecture=self.architecture)
        if self.moe:
            config |= moe_to_hf(fields)
        return config | self.to_hf(fields)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", "LlamaForCausalLM", llama.from_hf, llama.to_hf),
        Family("qwen2", "Qwen2ForCausalLM", qwen2.from_hf, qwen2.to_hf, attention_bias=True),
        Family("qwen3", "Qwen3ForCausalLM", qwen3.from_hf, qwen3.to_hf, qk_norm=True),
        Family(
            "qwen3_moe", "Qwen3MoeForCausalLM", qwen3_moe.from_hf, qwen3_moe.to_hf,
            moe=True, qk_norm=True,
        ),
        Family(
            "qwen2_moe", "Qwen2MoeForCausalLM", qwen2_moe.from_hf, qwen2_moe.to_hf,
            moe=True, attention_bias=True,
        ),
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
