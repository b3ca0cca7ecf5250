"""Shared fixtures of the lever tests: a tiny fp32 model config and packed micro-batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.trainer.config import LossConfig, ModelConfig, TrainerConfig
from tidal.trainer.train_step import LossKind, Trainer

TINY: dict[str, Any] = dict(
    dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32, tie_embeddings=False
)


def packed_batch(seed: int, lengths: list[int]) -> MicroBatchData:
    """A packed micro-batch of random samples; first 2 tokens of each are prompt; each
    token's advantage is its sample's plus a term of its own."""
    g = torch.Generator().manual_seed(seed)
    sample_lengths = torch.tensor(lengths)
    total = int(sample_lengths.sum())
    mask = torch.cat([(torch.arange(n) >= 2).float() for n in lengths])
    advantages = torch.cat([torch.full((n,), float(torch.randn((), generator=g))) for n in lengths])
    advantages = advantages + torch.randn(total, generator=g) * 0.5  # varying per token
    return MicroBatchData(
        input_ids=torch.randint(0, 259, (total,), generator=g),
        position_ids=positions_for(sample_lengths),
        sample_lengths=sample_lengths,
        loss_mask=mask,
        advantages=advantages * mask,
        behaviour_logprobs=(-torch.rand(total, generator=g) * 4 - 3) * mask,
    )


@pytest.fixture
def batches() -> list[MicroBatchData]:
    return [packed_batch(1, [9, 12, 7]), packed_batch(2, [20, 5])]


def make_trainer(loss: dict[str, Any] | None = None, **model: Any) -> Trainer:
    config = TrainerConfig(
        model=ModelConfig.model_validate({**TINY, **model}),
        loss=LossConfig.model_validate(loss or {}),
        device="cpu",
    )
    return Trainer(config, seed=0, device=torch.device("cpu"))


def loss_and_grads(
    trainer: Trainer, batches: list[MicroBatchData], kind: LossKind = "pg"
) -> tuple[float, dict[str, torch.Tensor]]:
    """The step loss and every parameter's gradient (named as in the state dict)."""
    torch.manual_seed(0)
    sums = trainer.compute_gradients(batches, kind)
    grads = {
        name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None
    }
    return float(sums["loss"]), grads


def assert_same(
    a: tuple[float, dict[str, torch.Tensor]],
    b: tuple[float, dict[str, torch.Tensor]],
    atol: float = 1e-5,
) -> None:
    assert a[0] == pytest.approx(b[0], abs=atol)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], atol=atol, rtol=0, msg=name)


# An RL loss that uses every path through the logits: clipped ratio, KL to the reference
# and the entropy bonus (gradient through the entropy).
FULL_LOSS: dict[str, Any] = {"kl": {"coef": 0.1}, "entropy_coef": 0.01}
