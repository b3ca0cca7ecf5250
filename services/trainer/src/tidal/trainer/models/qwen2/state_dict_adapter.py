"""Qwen2 ⇄ Hugging Face checkpoint names: the identity (our parameter names are HF's).

A tied head is the factory's business (`lm_head.weight` is dropped on export when tied).
"""

from __future__ import annotations

from tidal.trainer.models.family import StateDictAdapter


class Qwen2StateDictAdapter(StateDictAdapter):
    """Dense Qwen2: nothing to rename or reshape."""
