"""The chunked LM head equals log-softmax over full logits, in values and gradients."""

from __future__ import annotations

import pydantic
import pytest
import torch

from tidal.trainer.config import ModelConfig
from tidal.trainer.memory.chunk_size import resolve_chunk_size
from tidal.trainer.memory.lm_head import chunked_logprobs_entropy

from .conftest import FULL_LOSS, assert_same, loss_and_grads, make_trainer


def reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
    logprobs_all = torch.log_softmax(hidden @ weight.T, dim=-1)  # (N, V)
    entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    return logprobs_all.gather(-1, targets[:, None]).squeeze(-1), entropy


@pytest.mark.parametrize("chunk", [1, 7, 16, 100])
def test_values_and_gradients_equal_full_logits(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (37,), generator=g)
    w_lp, w_ent = torch.randn(37, generator=g), torch.randn(37, generator=g)

    ref_lp, ref_ent = reference(hidden, weight, targets)
    ((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum()).backward()
    ref_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk=chunk)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden.grad, ref_grads[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(weight.grad, ref_grads[1], atol=1e-5, rtol=0)


def test_gradient_of_logprobs_alone_passes_gradcheck() -> None:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 6, (5,), generator=g)
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_logprobs_entropy(h, w, targets, chunk=2), (hidden, weight)
    )


@pytest.mark.parametrize("kind", ["pg", "sft"])
def test_trainer_loss_and_gradients_equal_the_unchunked_head(batches, kind) -> None:
    off = loss_and_grads(make_trainer(FULL_LOSS), batches, kind)
    on = loss_and_grads(make_trainer(FULL_LOSS, fused_lm_head_token_chunk_size=5), batches, kind)
    assert_same(on, off)


@pytest.mark.parametrize(
    "correction",
    [
        {"objective": "decoupled", "tis_cap": 2.0},
        {"tis_cap": 1.5, "trust_region": {"ratio_low": 0.1, "ratio_high": 10.0}},
        {"trust_region": {"sequence_ratio_high": 1e3, "geo_ratio_low": 0.3}},
    ],
)
def test_off_policy_corrections_equal_with_the_unchunked_head(batches, correction) -> None:
    loss = {**FULL_LOSS, **correction}
    off = loss_and_grads(make_trainer(loss), batches)
    on = loss_and_grads(make_trainer(loss, fused_lm_head_token_chunk_size=5), batches)
    assert_same(on, off)


def test_tied_embeddings_get_the_gradient_of_both_uses(batches) -> None:
    off = loss_and_grads(make_trainer(FULL_LOSS, tie_embeddings=True), batches)
    on = loss_and_grads(
        make_trainer(FULL_LOSS, tie_embeddings=True, fused_lm_head_token_chunk_size="auto"),
        batches,
    )
    assert_same(on, off)


def test_auto_sizes_chunks_by_vocabulary_and_disabled_is_none() -> None:
    assert resolve_chunk_size("auto", 32768) == 512  # 64 MiB of fp32 logits
    assert resolve_chunk_size("disabled", 32768) is None
    assert resolve_chunk_size(64, 32768) == 64


@pytest.mark.parametrize("size", [0, -3])
def test_a_chunk_size_below_one_is_a_config_error_naming_the_field(size: int) -> None:
    with pytest.raises(pydantic.ValidationError, match="fused_lm_head_token_chunk_size"):
        ModelConfig(fused_lm_head_token_chunk_size=size)
