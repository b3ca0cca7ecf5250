"""Tiny models for the model library's tests: ours from `DecoderArgs` (seeded), and random
transformers models, one per family we implement, built locally (no hub).

Every parameter of the transformers models (norm weights and biases included) is drawn at
random, so a parity test exercises each of them; initial ones and zeros would hide a
missing bias or norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM

transformers = pytest.importorskip("transformers")


def seeded_model(args: DecoderArgs, *, seed: int = 0, std: float = 0.02) -> DecoderLM:
    """Our model of `args` in fp32 with weights drawn from `seed` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DecoderLM(args)
        model.init_weights(std)
    return model


COMMON: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
}
MOE: dict[str, Any] = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "router_aux_loss_coef": 0.01,
}

# family → (transformers config class name, config overrides)
TINY: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": (
        "LlamaConfig",
        {
            "tie_word_embeddings": False,
            # Llama 3.1 scaling with a short original context, so all three bands occur.
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "llama_tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "llama_linear_rope": (
        "LlamaConfig",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"head_dim": 16, "tie_word_embeddings": False}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {**MOE, "head_dim": 16, "norm_topk_prob": True, "tie_word_embeddings": False},
    ),
    "qwen3_moe_dense_first": (
        "Qwen3MoeConfig",
        {**MOE, "head_dim": 8, "norm_topk_prob": False, "mlp_only_layers": [0]},
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {**MOE, "shared_expert_intermediate_size": 24, "tie_word_embeddings": False},
    ),
}


def build_hf(name: str, seed: int = 0) -> Any:
    cls_name, overrides = TINY[name]
    config = getattr(transformers, cls_name)(**{**COMMON, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", dtype=torch.float32
        )
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0) * 0.5)
    return model.eval()


@pytest.fixture
def hf_model() -> Callable[..., Any]:
    return build_hf
