"""Choosing the tokenizer from config, and checking it fits the model.

Decisions:
- One spec string, as `run.tokenizer` holds it: "auto" (the default: the model folder's
  tokenizer when the run starts from one, else bytes), "byte" (the embedded default),
  "model" (the tokenizer of the model folder the run loads, `model_path`, required), or
  a path to a Hugging Face model folder. "auto"/"model" keep a config from naming the
  same folder twice, and make every service agree on one tokenizer.
- Every failure is a `ConfigError` (found before anything starts) whose message names
  the spec, the missing file and what to do.
- A folder whose `config.json` states `vocab_size` is checked at load: a tokenizer id
  beyond the embedding would fail much later, inside a forward pass, as an index error.
  The model may be larger than the tokenizer (embeddings are padded to a multiple of
  64 or 128), never smaller.
"""

from __future__ import annotations

from pathlib import Path

from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.hf import HFTokenizer
from tidal.text.protocol import Tokenizer

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
