"""Build the served model from a published HF config and load published weights into it.

The model is built once, from the first version's `config.json`; later versions are
copied into its parameters in place, so the KV cache and rope tables stay valid, and a
version of another architecture is refused. Every name and shape, and the tokenizer's fit
to the embedding, is checked before the first copy, so a bad version leaves the served
weights untouched (a ValueError the watcher logs and the engine reports). Tied heads are
published without `lm_head.weight`; the tie is re-asserted after every load.
"""

from __future__ import annotations

from typing import Any

import torch

from tidal.models.args import DecoderArgs
from tidal.models.hf_checkpoint import hf_to_native_state_dict, model_from_hf_config
from tidal.models.layers import DecoderLM
from tidal.models.rope import rope_tables
from tidal.text.loader import VocabMismatch, check_vocab
from tidal.text.tokenizer import Tokenizer

TIED_HEAD = "lm_head.weight"


def build_model(
    hf_config: dict[str, Any], *, device: torch.device, dtype: torch.dtype
) -> DecoderLM:
    """An inference-mode model of the architecture `hf_config` describes (weights unset)."""
    model = model_from_hf_config(hf_config, impl="custom", device=device, dtype=dtype).eval()
    cos, sin = rope_tables(model.args, device=device)
    model.rope_cos, model.rope_sin = cos, sin  # fp32 even when the weights are bf16
    model.requires_grad_(False)
    return model


def check_tokenizer_fits(tokenizer: Tokenizer, hf_config: dict[str, Any]) -> None:
    """Raise ValueError (naming both sizes) when `tokenizer` has ids beyond the model's
    embedding rows."""
    try:
        check_vocab(tokenizer, DecoderArgs.from_hf_config(hf_config).vocab_size)
    except VocabMismatch as exc:
        raise ValueError(str(exc)) from exc


def describe_model(model: DecoderLM) -> str:
    """E.g. "qwen3-28x1024 (vocab 151,936, tied, 596M params)": family, layers x width,
    embedding rows and whether the head shares them (what tells two folders of one family
    and shape apart), parameter count."""
    a = model.args
    params = sum(p.numel() for p in model.parameters())  # shared (tied) tensors once
    return describe_shape(
        a.family, a.n_layers, a.dim, a.vocab_size, tied=a.tie_embeddings, params=params
    )


def describe_shape(
    family: str, layers: int, dim: int, vocab: int, *, tied: bool, params: int | None = None
) -> str:
    details = [f"vocab {vocab:,}", "tied" if tied else "untied"]
    details += [] if params is None else [f"{_count(params)} params"]
    return f"{family}-{layers}x{dim} ({', '.join(details)})"


def _count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def check_compatible(model: DecoderLM, hf_config: dict[str, Any]) -> None:
    """Raise ValueError when `hf_config` describes another architecture than `model`'s."""
    args = DecoderArgs.from_hf_config(hf_config)
    if args != model.args:
        changed = {
            k: (v, args.as_dict()[k])
            for k, v in model.args.as_dict().items()
            if args.as_dict()[k] != v
        }
        raise ValueError(f"model config changed (field: (served, new)): {changed}")


def load_weights(model: DecoderLM, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy a published state dict into `model`, all or nothing."""
    state_dict = hf_to_native_state_dict(model, state_dict)  # e.g. stack per-expert tensors
    expected = {name: t.shape for name, t in model.state_dict().items()}
    optional = {TIED_HEAD} if model.args.tie_embeddings else set()
    missing = sorted(set(expected) - set(state_dict) - optional)
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"state dict does not fit the model: missing {missing}, unexpected {unexpected}"
        )
    for name, tensor in state_dict.items():
        if tensor.shape != expected[name]:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, the model expects {tuple(expected[name])}"
            )
    with torch.no_grad():
        model.load_state_dict(state_dict, strict=False)
        if model.args.tie_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
