"""The test-time model folders of tests/hf_folders.py are real model folders: transformers
and tidal.models load them, and their embedding fits the tokenizer exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.text.loader import load_tokenizer


def test_folders_load_as_models_with_the_tokenizers_vocab(folders: dict[str, Path]) -> None:
    transformers = pytest.importorskip("transformers")
    from tidal.models.hf_checkpoint import load_hf_folder

    for family, folder in folders.items():
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == family
        tokenizer = load_tokenizer(str(folder))
        assert config["vocab_size"] == tokenizer.vocab_size
        reference = transformers.AutoModelForCausalLM.from_pretrained(folder)
        assert reference.get_input_embeddings().num_embeddings == tokenizer.vocab_size
        ours = load_hf_folder(folder)
        assert ours.args.vocab_size == tokenizer.vocab_size
