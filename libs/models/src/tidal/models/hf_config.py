"""Mapping between Hugging Face `config.json` keys and `DecoderArgs` fields, shared by the families.

Both directions work on field dicts (`Fields`), not on `DecoderArgs`, so this module sits
below `args.py` and the family registry. A feature our blocks do not implement (sliding
window, other activations, MLP biases, partial rotary, other RoPE types) is refused with
an error naming the key, never ignored. Reading a folder's `config.json` lives here, not
in torch-importing `hf_folder.py`, so configs read a model's architecture without torch.
Token ids are not architecture: the trainer's `persistence/hf_folder_files.py` writes them
from the source folder and the tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tidal.models.rope_scaling import ROPE_TYPES, RopeScaling

CONFIG = "config.json"
Fields = dict[str, Any]  # DecoderArgs fields by name (`DecoderArgs.as_dict()`)


class UnsupportedConfig(ValueError):
    """A config.json asks for something our implementation does not do."""


class ModelFolderError(ValueError):
    """A model folder is missing a file or is inconsistent."""


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's `config.json` (torch-free)."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise ModelFolderError(f"{path} not found: a model folder needs config.json")
    config: dict[str, Any] = json.loads(path.read_text())
    return config


def require(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise UnsupportedConfig(f"config.json has no {key!r}")
    return config[key]


def refuse(config: dict[str, Any], key: str, allowed: Any, why: str) -> None:
    """Raise when `config[key]` is present and not `allowed`."""
    value = config.get(key, allowed)
    if value is not None and value != allowed:
        raise UnsupportedConfig(f"config.json {key}={value!r} is not supported ({why})")


def rope_from_hf(config: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from transformers 5's `rope_parameters` (theta inside) or the
    older top-level `rope_theta` + `rope_scaling`."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UnsupportedConfig(
            f"config.json rope_type {kind!r} is not supported; supported: {ROPE_TYPES}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedConfig("config.json partial_rotary_factor != 1 is not supported")
    if kind == "default":
        return theta, None
    defaults = RopeScaling()
    return theta, RopeScaling(
        type=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(params.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            params.get(
                "original_max_position_embeddings",
                config.get("max_position_embeddings", defaults.original_max_position_embeddings),
            )
        ),
    )


def rope_to_hf(args: Fields) -> dict[str, Any]:
    """`rope_parameters` plus a top-level `rope_theta`: transformers 5 and older readers
    both understand it."""
    theta = args["rope_theta"]
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    s = args["rope_scaling"]
    if isinstance(s, RopeScaling):
        s = asdict(s)
    if s is not None and s["type"] != "default":
        params.update(rope_type=s["type"], factor=s["factor"])
        if s["type"] == "llama3":
            params.update(
                low_freq_factor=s["low_freq_factor"],
                high_freq_factor=s["high_freq_factor"],
                original_max_position_embeddings=s["original_max_position_embeddings"],
            )
    return {"rope_theta": theta, "rope_parameters": params}


def common_from_hf(config: dict[str, Any]) -> Fields:
    """`DecoderArgs` fields every family reads the same way."""
    refuse(config, "hidden_act", "silu", "only SwiGLU with silu is implemented")
    refuse(config, "use_sliding_window", False, "sliding-window attention is not implemented")
    refuse(config, "mlp_bias", False, "MLP biases are not implemented")
    theta, scaling = rope_from_hf(config)
    heads = require(config, "num_attention_heads")
    return {
        "vocab_size": require(config, "vocab_size"),
        "dim": require(config, "hidden_size"),
        "n_layers": require(config, "num_hidden_layers"),
        "n_heads": heads,
        "n_kv_heads": config.get("num_key_value_heads") or heads,
        "ffn_dim": require(config, "intermediate_size"),
        "max_seq_len": require(config, "max_position_embeddings"),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "norm_eps": config.get("rms_norm_eps", 1e-6),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "head_dim": config.get("head_dim") or 0,
    }


def common_to_hf(args: Fields, *, model_type: str, architecture: str) -> dict[str, Any]:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": args["vocab_size"],
        "hidden_size": args["dim"],
        "num_hidden_layers": args["n_layers"],
        "num_attention_heads": args["n_heads"],
        "num_key_value_heads": args["n_kv_heads"],
        "head_dim": args["head_dim"],
        "intermediate_size": args["ffn_dim"],
        "max_position_embeddings": args["max_seq_len"],
        "rms_norm_eps": args["norm_eps"],
        "tie_word_embeddings": args["tie_embeddings"],
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **rope_to_hf(args),
    }


def moe_from_hf(config: dict[str, Any]) -> Fields:
    return {
        # transformers 5 writes `num_local_experts` for Qwen3-MoE, older versions `num_experts`.
        "n_experts": config.get("num_experts") or require(config, "num_local_experts"),
        "n_experts_per_tok": require(config, "num_experts_per_tok"),
        "moe_ffn_dim": require(config, "moe_intermediate_size"),
        "norm_topk_prob": bool(config.get("norm_topk_prob", True)),
        "decoder_sparse_step": config.get("decoder_sparse_step", 1),
        "mlp_only_layers": tuple(config.get("mlp_only_layers") or ()),
        "router_aux_loss_coef": config.get("router_aux_loss_coef", 0.001),
    }


def moe_to_hf(args: Fields) -> dict[str, Any]:
    return {
        "num_experts": args["n_experts"],
        "num_experts_per_tok": args["n_experts_per_tok"],
        "moe_intermediate_size": args["moe_ffn_dim"],
        "norm_topk_prob": args["norm_topk_prob"],
        "decoder_sparse_step": args["decoder_sparse_step"],
        "mlp_only_layers": list(args["mlp_only_layers"]),
        "router_aux_loss_coef": args["router_aux_loss_coef"],
    }
