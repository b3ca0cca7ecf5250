"""Published weights (HF checkpoint names) of every family load into the inference model."""

from __future__ import annotations

import pytest
import torch

from tidal.inference.loading import build_model as build_served_model
from tidal.inference.loading import load_weights
from tidal.models.args import DecoderArgs
from tidal.models.hf_checkpoint import publishable_state_dict
from tidal.models.layers import DecoderLM
from tidal.models.state_dict_adapter import WeightMismatch

SHAPE = {"vocab_size": 264, "dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
         "ffn_dim": 48, "max_seq_len": 128}  # fmt: skip
MOE = {"n_experts": 4, "n_experts_per_tok": 2, "moe_ffn_dim": 16}
ARGS = {
    "llama": DecoderArgs(**SHAPE),
    "qwen2": DecoderArgs(family="qwen2", attention_bias=True, **SHAPE),
    "qwen3": DecoderArgs(family="qwen3", qk_norm=True, head_dim=16, tie_embeddings=False, **SHAPE),
    "qwen3_moe": DecoderArgs(family="qwen3_moe", qk_norm=True, **SHAPE, **MOE),
}
IDS = torch.tensor([[256, 72, 105, 33, 7]])
POS = torch.arange(5)[None]


def trained_model(args: DecoderArgs) -> DecoderLM:
    """The trainer's side: a model with (seeded) weights to publish."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DecoderLM(args)
        model.init_weights()
    return model


@pytest.mark.parametrize("family", sorted(ARGS))
def test_inference_serves_the_published_weights_of_every_family(family: str) -> None:
    trained = trained_model(ARGS[family])
    served = build_served_model(
        trained.args.to_hf_config(), device=torch.device("cpu"), dtype=torch.float32
    )
    load_weights(served, publishable_state_dict(trained))
    with torch.no_grad():
        torch.testing.assert_close(served(IDS, POS), trained(IDS, POS), rtol=0, atol=0)


def test_published_moe_weights_missing_an_expert_are_refused() -> None:
    trained = trained_model(ARGS["qwen3_moe"])
    state = publishable_state_dict(trained)
    del state["model.layers.0.mlp.experts.1.gate_proj.weight"]
    served = build_served_model(
        trained.args.to_hf_config(), device=torch.device("cpu"), dtype=torch.float32
    )
    with pytest.raises(WeightMismatch, match=r"model\.layers\.0\.mlp\.experts\.1\.gate_proj"):
        load_weights(served, state)
