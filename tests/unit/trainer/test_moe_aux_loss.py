"""MoE training adds the load-balancing loss (scaled by router_aux_loss_coef) and reports
per-expert load; dense models report neither."""

from __future__ import annotations

import pytest
import torch

from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.train_step import Trainer

MOE = dict(
    family="qwen3_moe",
    dim=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    ffn_dim=64,
    moe_ffn_dim=32,
    n_experts=4,
    n_experts_per_tok=2,
    max_seq_len=32,
)


def _gradients(coef: float, samples) -> tuple[dict[str, float], dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    config = TrainerConfig(model=ModelConfig(**MOE, router_aux_loss_coef=coef), device="cpu")
    trainer = Trainer(config, seed=0, device=torch.device("cpu"))
    sums = trainer.compute_gradients([samples], "sft")
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return {k: float(v) for k, v in sums.items()}, grads


@pytest.fixture
def batch():  # type: ignore[no-untyped-def]
    from tidal.batch.tensors import MicroBatchData, positions_for

    lengths = torch.tensor([7, 9])
    ids = torch.randint(0, 259, (16,), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(16)
    return MicroBatchData(
        input_ids=ids,
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=torch.zeros(16),
        behaviour_logprobs=torch.zeros(16),
    )


def test_aux_loss_is_added_with_its_coefficient_and_load_is_reported(batch) -> None:  # type: ignore[no-untyped-def]
    plain, plain_grads = _gradients(0.0, batch)
    scaled, scaled_grads = _gradients(0.5, batch)
    assert scaled["aux_loss"] == pytest.approx(plain["aux_loss"]) and plain["aux_loss"] > 0
    assert scaled["loss"] - plain["loss"] == pytest.approx(0.5 * plain["aux_loss"], rel=1e-5)
    router = [n for n in plain_grads if "gate.weight" in n and "experts" not in n]
    assert router and any(not torch.allclose(plain_grads[n], scaled_grads[n]) for n in router)
    assert plain["expert_load_max"] >= 1.0 >= plain["expert_load_min"]


def test_dense_model_reports_no_router_terms(batch) -> None:  # type: ignore[no-untyped-def]
    dense = {k: v for k, v in MOE.items() if not k.startswith(("n_experts", "moe"))}
    config = TrainerConfig(model=ModelConfig(**{**dense, "family": "llama"}), device="cpu")
    sums = Trainer(config, seed=0, device=torch.device("cpu")).compute_gradients([batch], "sft")
    assert "aux_loss" not in sums
