"""`Family`: what one model family contributes (HF config mapping, adapter, model class).

Decisions:
- A family is data, not a subclass tree: the blocks are shared (`layers.py`, `moe.py`),
  so a family is its Hugging Face names, its config mapping and its state-dict adapter.
  `families.py` holds the registry; each `models/<family>/model.py` declares one.
- A state-dict adapter maps our state dict (HF in-memory names, experts stacked) to the
  HF *checkpoint* layout (what safetensors files on disk hold) and back. Dense families
  use the identity; MoE families split/stack experts. Adapters check every tensor they
  touch and raise `WeightMismatch` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tidal.trainer.models.args import DecoderArgs
from tidal.trainer.models.layers import DecoderLM

StateDict = dict[str, torch.Tensor]


class WeightMismatch(ValueError):
    """Weights do not fit the architecture: a missing, unexpected or mis-shaped tensor."""


class StateDictAdapter:
    """Identity adapter: our names are already HF checkpoint names (dense families)."""

    def to_hf(self, state: StateDict, args: DecoderArgs) -> StateDict:
        return dict(state)

    def from_hf(self, state: StateDict, args: DecoderArgs) -> StateDict:
        return dict(state)


@dataclass(frozen=True)
class Family:
    name: str  # our id: `ModelConfig.family`, `DecoderArgs.family`
    model_type: str  # HF `config.json` model_type
    architecture: str  # HF `config.json` architectures[0]
    from_hf_config: Callable[[dict[str, Any]], DecoderArgs]
    to_hf_config: Callable[[DecoderArgs], dict[str, Any]]
    model_class: type[DecoderLM]
    adapter: StateDictAdapter
