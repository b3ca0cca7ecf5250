"""Published weights (HF checkpoint names) of every family load into the inference model."""

from __future__ import annotations

import pytest
import torch

from tidal.inference.loading import build_model as build_served_model
from tidal.inference.loading import load_weights
from tidal.trainer.config import ModelConfig
from tidal.trainer.models.factory import build_model, publishable_state_dict
from tidal.trainer.models.family import WeightMismatch

SHAPE = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 48}
MOE = {"n_experts": 4, "n_experts_per_tok": 2, "moe_ffn_dim": 16}
CONFIGS = {
    "llama": ModelConfig(**SHAPE),
    "qwen2": ModelConfig(family="qwen2", **SHAPE),
    "qwen3": ModelConfig(family="qwen3", head_dim=16, tie_embeddings=False, **SHAPE),
    "qwen3_moe": ModelConfig(family="qwen3_moe", **SHAPE, **MOE),
}
IDS = torch.tensor([[256, 72, 105, 33, 7]])
POS = torch.arange(5)[None]


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_inference_serves_the_published_weights_of_every_family(family: str) -> None:
    trained = build_model(CONFIGS[family], seed=0)
    served = build_served_model(
        trained.args.to_hf_config(), device=torch.device("cpu"), dtype=torch.float32
    )
    load_weights(served, publishable_state_dict(trained))
    with torch.no_grad():
        torch.testing.assert_close(served(IDS, POS), trained(IDS, POS), rtol=0, atol=0)


def test_published_moe_weights_missing_an_expert_are_refused() -> None:
    trained = build_model(CONFIGS["qwen3_moe"], seed=0)
    state = publishable_state_dict(trained)
    del state["model.layers.0.mlp.experts.1.gate_proj.weight"]
    served = build_served_model(
        trained.args.to_hf_config(), device=torch.device("cpu"), dtype=torch.float32
    )
    with pytest.raises(WeightMismatch, match=r"model\.layers\.0\.mlp\.experts\.1\.gate_proj"):
        load_weights(served, state)
