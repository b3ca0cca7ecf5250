"""What a complete model folder carries beside its weights: the tokenizer's token ids in
`config.json`, `generation_config.json`, and the tokenizer files with the chat template.

Decisions:
- One place builds them from the run's tokenizer (`run.tokenizer` with the model folder),
  and both writers use it: every published version (`publisher.py`) and `tidal export`
  (`export.py`). A published version is then a folder `transformers` and vLLM load as is,
  tokenizer included; before, versions and exports held only weights and an
  architecture-only config.json.
- Token ids come from our tokenizer (`tidal.text`), the same object the services
  tokenize with: `config.json` gets `bos_token_id`, `eos_token_id` (the tokenizer's own
  EOS, as Hugging Face configs hold one int) and `pad_token_id`; `generation_config.json`
  gets every id that ends generation (`eos_ids`: EOS, the folder's generation EOS list,
  the chat template's end-of-turn token). A source folder's `generation_config.json` is
  kept otherwise (its sampling defaults belong to the model), only the ids are ours.
- Tokenizer files are copied byte for byte from the tokenizer's folder
  (`tokenizer.json`, `tokenizer_config.json`, and `special_tokens_map.json` and
  `chat_template.jinja` when present), so tokenization of the export is identical to the
  source's. The byte tokenizer has no Hugging Face files: its ids are written honestly
  and no `tokenizer.json` is invented (docs/models.md).
- The files are bytes in memory (small next to the weights) so the publisher hands them
  to any transport: they go into the version's manifest with their sha256 like the
  weights, and a replica verifies them as it verifies the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.models.hf_config import with_token_ids
from tidal.text.hf_folder import (
    CHAT_TEMPLATE_JINJA,
    GENERATION_CONFIG,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
)
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.loader import load_tokenizer
from tidal.text.tokenizer import Tokenizer

TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, CHAT_TEMPLATE_JINJA)
"""Copied from the tokenizer's folder when present (`tokenizer.json` always is)."""


@dataclass(frozen=True)
class CompanionFiles:
    """Token ids and the non-weight files of a complete model folder."""

    bos_id: int | None
    eos_id: int
    eos_ids: tuple[int, ...]
    pad_id: int | None
    files: dict[str, bytes] = field(default_factory=dict)
    """File name → bytes: generation_config.json and the tokenizer files."""

    def config(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        """`hf_config` (the architecture) with the tokenizer's token ids."""
        return with_token_ids(hf_config, bos=self.bos_id, eos=self.eos_id, pad=self.pad_id)


def companion_files(tokenizer: Tokenizer, *, source: Path | None = None) -> CompanionFiles:
    """The companions of `tokenizer`'s model; `source` is the folder the run started from
    (its generation_config.json's other settings are kept)."""
    generation: dict[str, Any] = {}
    if source is not None and (source / GENERATION_CONFIG).is_file():
        generation = json.loads((source / GENERATION_CONFIG).read_text())
    generation.update(
        bos_token_id=tokenizer.bos_id,
        eos_token_id=list(tokenizer.eos_ids),
        pad_token_id=tokenizer.pad_id,
    )
    files = {GENERATION_CONFIG: json.dumps(generation, indent=2).encode()}
    if isinstance(tokenizer, HFTokenizer):
        folder = tokenizer.files.folder
        for name in TOKENIZER_FILES:
            if (folder / name).is_file():
                files[name] = (folder / name).read_bytes()
    return CompanionFiles(
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        eos_ids=tuple(tokenizer.eos_ids),
        pad_id=tokenizer.pad_id,
        files=files,
    )


def run_companion_files(spec: str, model_path: Path | None) -> CompanionFiles:
    """The companions of the run's tokenizer (`run.tokenizer`, `trainer.model.path`)."""
    return companion_files(load_tokenizer(spec, model_path=model_path), source=model_path)
