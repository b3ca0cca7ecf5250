"""Tokenizers for the text library's tests: the Qwen3- and Llama-3-style folders of
`tests/hf_folders.py` (built once per session), ours and `transformers`' for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.text.hf_tokenizer import HFTokenizer

from ...hf_folders import llama_folder, qwen3_folder, sentencepiece_style_folder

__all__ = ["llama_folder", "qwen3_folder", "sentencepiece_style_folder"]

FAMILIES = ["qwen3", "llama"]


@pytest.fixture(scope="session")
def folders(qwen3_folder: Path, llama_folder: Path) -> dict[str, Path]:
    return {"qwen3": qwen3_folder, "llama": llama_folder}


@pytest.fixture(scope="session")
def all_folders(folders: dict[str, Path], sentencepiece_style_folder: Path) -> dict[str, Path]:
    """The model folders plus the tokenizer-only Llama 2-style one."""
    return {**folders, "sentencepiece": sentencepiece_style_folder}


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ours(family: str, folders: dict[str, Path]) -> HFTokenizer:
    return HFTokenizer.from_folder(folders[family])


_REFERENCE: dict[Path, Any] = {}


@pytest.fixture
def reference(family: str, folders: dict[str, Path]) -> Any:
    """`transformers.AutoTokenizer` on the same folder (loaded once per folder)."""
    transformers = pytest.importorskip("transformers")
    folder = folders[family]
    if folder not in _REFERENCE:
        _REFERENCE[folder] = transformers.AutoTokenizer.from_pretrained(folder)
    return _REFERENCE[folder]
