"""What makes weights a complete Hugging Face folder: the tokenizer's token ids in
`config.json`, `generation_config.json`, and the tokenizer files with the chat template.

Built once from the run's tokenizer (the one every service tokenizes with) and used by
every writer of a model folder: published versions, `tidal export` and `tidal sft`'s final
weights. Tokenizer files are copied byte for byte; a source folder's generation settings
are kept and only its token ids replaced; the byte tokenizer gets honest ids and no
invented `tokenizer.json`. The files are bytes, so any transport carries them.
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
class HFFolderFiles:
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


def hf_folder_files(tokenizer: Tokenizer, *, source: Path | None = None) -> HFFolderFiles:
    """The files of `tokenizer`'s model folder; `source` is the folder the run started from
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
    return HFFolderFiles(
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        eos_ids=tuple(tokenizer.eos_ids),
        pad_id=tokenizer.pad_id,
        files=files,
    )


def run_hf_folder_files(spec: str, model_path: Path | None) -> HFFolderFiles:
    """The files of the run's tokenizer (`run.tokenizer`, `trainer.model.path`)."""
    return hf_folder_files(load_tokenizer(spec, model_path=model_path), source=model_path)
