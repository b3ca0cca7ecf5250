"""The registry of supported model families: the one list, and choosing one from an HF config.

Decisions:
- `FAMILIES` is the only place a family is listed. `FamilyName` (the `Literal` pydantic
  configs validate `family` against) and `MOE_FAMILIES` are derived from it, so adding a
  family is one module plus one entry here.
- Torch-free (records and config mappings only), so configs and the memory planner
  import it without torch.
- Families are chosen by `architectures[0]` (what transformers itself uses), falling
  back to `model_type`; an unknown one is an error that lists the supported
  architectures, never a guess.
"""

from __future__ import annotations

from typing import Any, Literal

from tidal.models import llama, qwen2, qwen2_moe, qwen3, qwen3_moe
from tidal.models.family import Family

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, qwen3_moe.FAMILY, qwen2_moe.FAMILY)
}
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
