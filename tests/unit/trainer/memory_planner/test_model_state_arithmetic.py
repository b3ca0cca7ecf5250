"""The planner's model-state arithmetic: parameter counts and the ZeRO paper's example."""

from __future__ import annotations

import pytest
import torch

from tidal.trainer.config import ModelConfig
from tidal.trainer.memory_planner.estimate import GB, zero_model_states
from tidal.trainer.memory_planner.model_size import param_counts
from tidal.trainer.model_factory import build_model

FAMILIES = [
    {"family": "llama"},
    {"family": "llama", "tie_embeddings": False},
    {"family": "qwen2"},
    {"family": "qwen3", "head_dim": 16},
    {"family": "qwen3_moe", "n_experts": 4, "moe_ffn_dim": 48, "decoder_sparse_step": 2},
    {"family": "qwen2_moe", "n_experts": 4, "moe_ffn_dim": 48, "shared_expert_ffn_dim": 40},
]


@pytest.mark.parametrize("arch", FAMILIES, ids=lambda a: "-".join(map(str, a.values())))
def test_parameter_count_equals_the_built_model(arch: dict) -> None:
    config = ModelConfig.model_validate({"dim": 64, "n_layers": 2, "ffn_dim": 96, **arch})
    model = build_model(config, seed=0, device=torch.device("cpu"))
    assert param_counts(config.decoder_args()).total == sum(p.numel() for p in model.parameters())


def test_zero_paper_example_per_device_model_states() -> None:
    """ZeRO (Rajbhandari et al., 2020), Figure 1: Ψ = 7.5B, Nd = 64, K = 12 (mixed-precision
    Adam): 120 GB baseline, 31.4 GB P_os, 16.6 GB P_os+g, 1.9 GB P_os+g+p per device."""
    published = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gigabytes in published.items():
        states = zero_model_states(7.5e9, 64, stage=stage)
        assert round(states.total / GB, 1) == gigabytes, f"stage {stage}"
