"""What makes weights a complete Hugging Face folder: the special-token ids in
`config.json`, `generation_config.json`, and the tokenizer files with the chat template.

Built once from the run's tokenizer (the one every service tokenizes with) and the folder
the run started from, and used by every writer of a model folder: published versions,
`tidal export` and `tidal sft`'s final weights. Every `*_token_id` the source folder
declares is kept as declared; the tokenizer only fills the ids the folder leaves unset and
adds its end-of-turn ids to the generation config's eos list. Tokenizer files are copied
byte for byte; the byte tokenizer gets honest ids and no invented `tokenizer.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.text.hf_folder import (
    CHAT_TEMPLATE_JINJA,
    GENERATION_CONFIG,
    MODEL_CONFIG,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
)
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.loader import load_tokenizer
from tidal.text.tokenizer import Tokenizer

TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, CHAT_TEMPLATE_JINJA)
"""Copied from the tokenizer's folder when present (`tokenizer.json` always is)."""

TokenIds = dict[str, Any]
"""`bos_token_id`, `eos_token_id` (an int or a list), `pad_token_id`, … → id (None: unset)."""


@dataclass(frozen=True)
class HFFolderFiles:
    """Token ids and the non-weight files of a complete model folder."""

    token_ids: TokenIds
    """What config.json says about special tokens."""
    files: dict[str, bytes] = field(default_factory=dict)
    """File name → bytes: generation_config.json and the tokenizer files."""

    def config(self, hf_config: dict[str, Any]) -> dict[str, Any]:
        """`hf_config` (the architecture) with the folder's special-token ids."""
        return {**hf_config, **self.token_ids}


def declared_token_ids(settings: dict[str, Any]) -> TokenIds:
    """The `*_token_id` entries a config file sets (a null one declares nothing)."""
    return {k: v for k, v in settings.items() if k.endswith("_token_id") and v is not None}


def with_eos(declared: int | list[int], more: tuple[int, ...]) -> int | list[int]:
    """`declared` (as written) followed by the ids of `more` it lacks."""
    ids = [declared] if isinstance(declared, int) else list(declared)
    missing = [i for i in more if i not in ids]
    return [*ids, *missing] if missing else declared


def hf_folder_files(tokenizer: Tokenizer, *, source: Path | None = None) -> HFFolderFiles:
    """The files of `tokenizer`'s model folder; `source` is the folder the run started from
    (its token ids and generation settings are kept)."""
    model = _read(source, MODEL_CONFIG)
    generation = _read(source, GENERATION_CONFIG)
    token_ids = {
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
        **declared_token_ids(model),
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if generation.get(key) is None:
            generation[key] = token_ids[key]
    generation["eos_token_id"] = with_eos(generation["eos_token_id"], tuple(tokenizer.eos_ids))
    files = {GENERATION_CONFIG: json.dumps(generation, indent=2).encode()}
    if isinstance(tokenizer, HFTokenizer):
        folder = tokenizer.files.folder
        for name in TOKENIZER_FILES:
            if (folder / name).is_file():
                files[name] = (folder / name).read_bytes()
    return HFFolderFiles(token_ids=token_ids, files=files)


def _read(folder: Path | None, name: str) -> dict[str, Any]:
    if folder is None or not (folder / name).is_file():
        return {}
    settings: dict[str, Any] = json.loads((folder / name).read_text())
    return settings


def run_hf_folder_files(spec: str, model_path: Path | None) -> HFFolderFiles:
    """The files of the run's tokenizer (`run.tokenizer`, `trainer.model.path`)."""
    return hf_folder_files(load_tokenizer(spec, model_path=model_path), source=model_path)
