"""What a Hugging Face model folder says about its tokenizer, read once.

Every file is read into one frozen `TokenizerFiles` that `hf_tokenizer` builds from, and
every fault is a `TokenizerFolderError` naming the file. Only `tokenizer.json` is
required; slow-tokenizer files are not converted, because a folder tokenized differently
from its authors' fast tokenizer would fail silently. docs/tokenizers.md lists what is
taken from each file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.common.errors import ConfigError

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"
MODEL_CONFIG = "config.json"
SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


class TokenizerFolderError(ConfigError):
    """A model folder's tokenizer files are missing or malformed."""


@dataclass(frozen=True)
class TokenizerFiles:
    folder: Path
    tokenizer_json: Path
    special_tokens: dict[str, str]  # bos_token/eos_token/pad_token/unk_token → string
    add_bos_token: bool | None  # None: the config does not say
    add_eos_token: bool | None
    added_tokens: dict[int, dict[str, Any]]  # added_tokens_decoder: id → AddedToken fields
    chat_template: str | list[dict[str, str]] | None
    chat_template_origin: str
    generation_eos_ids: tuple[int, ...]
    model_vocab_size: int | None
    response_template: dict[str, Any] | None = None
    """tokenizer_config.json's `response_template` (how `transformers` parses a reply)."""


def token_string(value: Any, *, where: str) -> str | None:
    """A special token written as a string or as an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerFolderError(
        f"{where}: expected a token string or {{content: ...}}, got {value!r}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TokenizerFolderError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerFolderError(f"{path} must hold a JSON object")
    return data


def _optional_json(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


def _eos_list(value: Any, *, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise TokenizerFolderError(
        f"{where}: eos_token_id must be an int or a list of ints, got {value!r}"
    )


def read_tokenizer_files(folder: Path) -> TokenizerFiles:
    """Everything the folder says about its tokenizer; raises naming the file at fault."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TokenizerFolderError(
            f"tokenizer folder {folder} does not exist: point the tokenizer at a Hugging Face "
            'model folder, or use "byte"'
        )
    tokenizer_json = folder / TOKENIZER_JSON
    if not tokenizer_json.is_file():
        others = [
            n for n in ("tokenizer.model", "vocab.json", "merges.txt") if (folder / n).exists()
        ]
        hint = (
            f" (it has {', '.join(others)}: slow-tokenizer files are not converted)"
            if others
            else ""
        )
        raise TokenizerFolderError(
            f"{tokenizer_json} is missing{hint}: save the tokenizer with "
            "`AutoTokenizer.from_pretrained(...).save_pretrained(folder)` to write it"
        )
    config = _optional_json(folder / TOKENIZER_CONFIG)
    special_map = _optional_json(folder / SPECIAL_TOKENS_MAP)
    specials: dict[str, str] = {}
    for name in SPECIAL_NAMES:
        value = token_string(config.get(name), where=f"{folder / TOKENIZER_CONFIG} {name}")
        if value is None:
            value = token_string(
                special_map.get(name), where=f"{folder / SPECIAL_TOKENS_MAP} {name}"
            )
        if value is not None:
            specials[name] = value
    added = config.get("added_tokens_decoder") or {}
    if not isinstance(added, dict):
        raise TokenizerFolderError(
            f"{folder / TOKENIZER_CONFIG}: added_tokens_decoder must be a mapping"
        )
    template: str | list[dict[str, str]] | None = config.get("chat_template")
    origin = str(folder / TOKENIZER_CONFIG)
    jinja_file = folder / CHAT_TEMPLATE_JINJA
    if jinja_file.is_file():
        template, origin = jinja_file.read_text(encoding="utf-8"), str(jinja_file)
    generation = _optional_json(folder / GENERATION_CONFIG)
    model_config = _optional_json(folder / MODEL_CONFIG)
    eos_source = generation if "eos_token_id" in generation else model_config
    vocab = model_config.get("vocab_size")
    return TokenizerFiles(
        folder=folder,
        tokenizer_json=tokenizer_json,
        special_tokens=specials,
        add_bos_token=config.get("add_bos_token"),
        add_eos_token=config.get("add_eos_token"),
        added_tokens={int(i): dict(t) for i, t in added.items()},
        chat_template=template,
        chat_template_origin=origin,
        generation_eos_ids=_eos_list(
            eos_source.get("eos_token_id"), where=f"{folder} eos_token_id"
        ),
        model_vocab_size=vocab if isinstance(vocab, int) else None,
        response_template=response
        if isinstance(response := config.get("response_template"), dict)
        else None,
    )
