"""The tokenizer a run's config names, checked against the model it feeds.

`run.tokenizer` is one spec: "auto" (the model folder's tokenizer when the run loads
one, else bytes), "byte", "model" (the run's model folder) or a folder path, so a config
never names one folder twice and every service resolves the same tokenizer. Failures
are `ConfigError`s raised before anything starts; a tokenizer id beyond the model's
embedding is one of them, not an index error inside a forward pass.
"""

from __future__ import annotations

from pathlib import Path

from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.tokenizer import Tokenizer

AUTO = "auto"
BYTE = "byte"
MODEL = "model"


class VocabMismatch(ConfigError):
    """The tokenizer produces ids the model's embedding has no row for."""


def load_tokenizer(spec: str, *, model_path: str | Path | None = None) -> Tokenizer:
    """The tokenizer `spec` names: "auto", "byte", "model" (the folder `model_path`) or a
    folder."""
    if spec == AUTO:
        spec = BYTE if model_path is None else MODEL
    if spec == BYTE:
        return ByteTokenizer()
    if spec == MODEL:
        if model_path is None:
            raise ConfigError(
                'tokenizer "model" needs a model folder, but the run has none: set the model '
                'path, or use tokenizer "byte"'
            )
        spec = str(model_path)
    if not spec:
        raise ConfigError(
            'tokenizer spec is empty: use "auto", "byte", "model" or a model folder path'
        )
    tokenizer = HFTokenizer.from_folder(spec)
    if tokenizer.files.model_vocab_size is not None:
        check_vocab(tokenizer, tokenizer.files.model_vocab_size)
    return tokenizer


def check_vocab(tokenizer: Tokenizer, model_vocab_size: int) -> None:
    """Raise `VocabMismatch` when some tokenizer id has no row in the model's embedding."""
    if tokenizer.vocab_size > model_vocab_size:
        raise VocabMismatch(
            f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} ids but the model's "
            f"embedding has only {model_vocab_size} rows: use the tokenizer the model was "
            "trained with, or a model whose vocab_size is at least "
            f"{tokenizer.vocab_size}"
        )
