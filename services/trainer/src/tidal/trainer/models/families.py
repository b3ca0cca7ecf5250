"""The registry of supported model families, and choosing one from an HF config.

Decision: families are chosen by `architectures[0]` (what transformers itself uses),
falling back to `model_type`; an unknown one is an error that lists the supported
architectures, never a guess.
"""

from __future__ import annotations

from typing import Any

from tidal.trainer.models.family import Family
from tidal.trainer.models.llama.model import FAMILY as LLAMA
from tidal.trainer.models.qwen2.model import FAMILY as QWEN2
from tidal.trainer.models.qwen2_moe.model import FAMILY as QWEN2_MOE
from tidal.trainer.models.qwen3.model import FAMILY as QWEN3
from tidal.trainer.models.qwen3_moe.model import FAMILY as QWEN3_MOE

FAMILIES: dict[str, Family] = {f.name: f for f in (LLAMA, QWEN2, QWEN3, QWEN3_MOE, QWEN2_MOE)}


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
    """The family of an HF `config.json` (by architectures[0], else model_type)."""
    architectures = config.get("architectures") or []
    for family in FAMILIES.values():
        if architectures and architectures[0] == family.architecture:
            return family
    model_type = config.get("model_type")
    for family in FAMILIES.values():
        if not architectures and model_type == family.model_type:
            return family
    named = architectures[0] if architectures else model_type
    raise UnsupportedArchitecture(
        f"unsupported architecture {named!r}; supported: {supported_architectures()}"
    )
