"""A run that starts from a Hugging Face folder: its architecture as `[trainer.model]`
values, and the check that the run's tokenizer fits the model's embedding.

The folder's `config.json` is the architecture: `ModelConfig` fills its fields in from it
(so `--dry-run`, the written config and the logs name the real model), accepts a key set
to the folder's value and refuses one set to another, naming both. Architectures only
transformers runs are not mapped. Torch-free, so configs and `tidal plan` read real
models instantly.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from tidal.common.errors import ConfigError
from tidal.models.args import DecoderArgs
from tidal.models.families import UnsupportedArchitecture, family_for_hf_config
from tidal.models.hf_config import ModelFolderError, UnsupportedConfig, read_config

MOE_FIELDS = (
    "n_experts", "n_experts_per_tok", "moe_ffn_dim", "norm_topk_prob", "shared_expert_ffn_dim",
    "decoder_sparse_step", "router_aux_loss_coef",
)  # fmt: skip
DENSE_FIELDS = (
    "family", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
    "max_seq_len", "rope_theta", "rope_scaling", "norm_eps", "tie_embeddings",
)  # fmt: skip
ARCHITECTURE_FIELDS = DENSE_FIELDS + MOE_FIELDS
"""`[trainer.model]` keys a model folder's config.json defines."""


def folder_architecture(path: Path) -> dict[str, Any] | None:
    """`[trainer.model]` values of the folder's architecture (`rope_scaling` as a dict or
    None), or None for an architecture we do not implement. Raises ValueError naming the
    folder when config.json is missing or asks for something unsupported."""
    if Path(path).is_file():
        raise ValueError(f"trainer.model.path {path} is a file, not a model folder: {_hint(path)}")
    try:
        config = read_config(path)
    except ModelFolderError as exc:
        raise ValueError(
            f"trainer.model.path: {exc}; download the model there (e.g. `huggingface-cli "
            "download Qwen/Qwen3-0.6B --local-dir DIR`) or point the path at its folder"
        ) from None
    try:
        family = family_for_hf_config(config)
    except UnsupportedArchitecture:
        return None
    try:
        args = DecoderArgs.from_hf_config(config)
    except (UnsupportedConfig, ValueError, TypeError) as exc:
        raise ValueError(f"trainer.model.path {path}: {exc}") from None
    fields = {name: getattr(args, name) for name in DENSE_FIELDS}
    # Stated only when config.json states it (Qwen3); else dim / n_heads, as ours.
    fields["head_dim"] = args.head_dim if config.get("head_dim") else None
    fields["rope_scaling"] = None if args.rope_scaling is None else asdict(args.rope_scaling)
    if family.moe:
        fields.update({name: getattr(args, name) for name in MOE_FIELDS})
    return fields


def _hint(path: Path) -> str:
    if Path(path).suffix.lower() == ".gguf":
        return (
            f"convert the GGUF file once with `tidal import-model {path} --out DIR` and point "
            "the path at DIR"
        )
    return "point the path at the model's folder (config.json, weights, tokenizer files)"


def conflicts(given: dict[str, Any], folder: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """One message per explicitly `given` key whose value is not the folder's (or, for a
    key the folder's family does not use, not the default)."""
    problems = []
    family = folder["family"]
    for key, value in given.items():
        if key in folder:
            if _same(value, folder[key]):
                continue
            problems.append(
                f"trainer.model.{key} = {_show(value)} but the folder's config.json says "
                f"{_show(folder[key])}: remove trainer.model.{key} (the folder defines it) or "
                "point trainer.model.path at the model you meant"
            )
        elif not _same(value, defaults[key]):
            problems.append(
                f"trainer.model.{key} = {_show(value)} does not apply to the folder's "
                f"{family!r} model (not a mixture of experts): remove it"
            )
    return problems


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and float(a) == float(b)
    return bool(a == b)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


BYTE_VOCAB = 259
"""Ids of the byte tokenizer (bytes, BOS, EOS, PAD)."""


def tokenizer_vocab_size(spec: str, model_path: Path | None) -> tuple[str, int]:
    """(name, id count) of the run's tokenizer, without building it when it is bytes."""
    from tidal.text.loader import AUTO, BYTE, load_tokenizer  # `tokenizers`: only for folders

    if spec == BYTE or (spec == AUTO and model_path is None):
        return "byte", BYTE_VOCAB
    tokenizer = load_tokenizer(spec, model_path=model_path)
    return tokenizer.name, tokenizer.vocab_size


def check_tokenizer_fits(spec: str, model_path: Path | None, model_vocab_size: int) -> None:
    """Raise ValueError naming both sizes when the run's tokenizer has ids beyond the
    model's embedding (`trainer.model.vocab_size`)."""
    try:
        name, size = tokenizer_vocab_size(spec, model_path)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if size > model_vocab_size:
        fix = (
            'use the tokenizer of the model\'s folder (run.tokenizer = "auto")'
            if model_path is not None
            else f"set trainer.model.vocab_size to at least {size}"
        )
        raise ValueError(
            f"run.tokenizer {name} has {size} ids but the model's embedding "
            f"(trainer.model.vocab_size) has only {model_vocab_size} rows: {fix}"
        )
