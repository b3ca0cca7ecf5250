"""`Family`: what one model family is (its Hugging Face names, switches and config mapping).

Decisions:
- A family is data, not a subclass tree: every family builds the one shared decoder
  (`layers.DecoderLM`), so a family is its Hugging Face names, the `DecoderArgs` switches
  it turns on and its `config.json` mapping. `families.py` holds the registry; each
  `tidal/models/<family>.py` declares one record.
- The record is torch-free and imports nothing of ours: the config mapping works on
  plain field dicts (`DecoderArgs.as_dict()` in, `DecoderArgs(**fields)` out), so the
  registry sits below `args.py` and `args.py` can name its family without a cycle, and
  pydantic configs (the trainer's `ModelConfig`) can list the families without torch.
- Which state-dict adapter a family needs follows from `moe` (`state_dict_adapter.py`):
  dense families' parameter names already are the checkpoint names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Fields = dict[str, Any]  # DecoderArgs fields by name (`DecoderArgs.as_dict()`)


@dataclass(frozen=True)
class Family:
    name: str  # our id: `ModelConfig.family`, `DecoderArgs.family`
    model_type: str  # HF `config.json` model_type
    architecture: str  # HF `config.json` architectures[0]
    from_hf_config: Callable[[dict[str, Any]], Fields]  # config.json → DecoderArgs fields
    to_hf_config: Callable[[Fields], dict[str, Any]]  # DecoderArgs fields → config.json
    moe: bool = False  # mixture-of-experts feed-forward (experts split/stacked on disk)
    attention_bias: bool = False  # biases on q/k/v projections (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
