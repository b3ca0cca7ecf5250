"""Activation checkpointing: same loss and gradients as without, names unchanged."""

from __future__ import annotations

import pydantic
import pytest
import torch

from tidal.trainer.config import ModelConfig
from tidal.trainer.parallel.ac import apply_ac

from .conftest import FULL_LOSS, assert_same, loss_and_grads, make_trainer

AC_SETTINGS = [
    {"mode": "full"},
    {"mode": "full", "freq": 2},
    {"mode": "selective", "targets": ["norm", "mlp"]},
    {"mode": "selective", "targets": ["attn_proj"]},
    {"mode": "selective", "targets": ["attention", "norm", "mlp"]},
]


@pytest.mark.parametrize("ac", AC_SETTINGS, ids=lambda ac: "-".join(map(str, ac.values())))
def test_checkpointing_gives_the_same_loss_and_gradients(batches, ac) -> None:
    off = loss_and_grads(make_trainer(FULL_LOSS), batches)
    on = loss_and_grads(make_trainer(FULL_LOSS, ac=ac), batches)
    assert_same(on, off)


def test_full_checkpointing_saves_only_block_inputs() -> None:
    """Evidence that blocks really are recomputed: far fewer tensors are kept for backward."""

    def saved_bytes(**model: object) -> int:
        trainer = make_trainer(**model)
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            if not isinstance(t, torch.nn.Parameter):
                total += t.numel() * t.element_size()
            return t

        ids = torch.randint(0, 259, (1, 32))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            trainer.model.hidden_states(ids, torch.arange(32)[None])
        return total

    assert saved_bytes(ac={"mode": "full"}) < saved_bytes() / 4


def test_frequency_picks_every_nth_block_and_names_stay_the_same() -> None:
    model = make_trainer().model
    names = [n for n, _ in model.named_parameters()]
    every_third = ModelConfig(ac={"freq": 3}).ac
    assert apply_ac(model, **every_third.model_dump()) == 2  # blocks 0 and 3 of 4
    flags = [getattr(b, "_tidal_checkpointed", False) for b in model.model.layers]
    assert flags == [True, False, False, True]
    assert [n for n, _ in model.named_parameters()] == names


def test_selective_with_a_frequency_is_a_config_error_naming_both_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"ac\.freq.*ac\.mode"):
        ModelConfig(ac={"mode": "selective", "freq": 2})


def test_an_unknown_selective_target_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"ac\.targets"):
        ModelConfig(ac={"mode": "selective", "targets": ["lm_head"]})


def test_moe_blocks_under_checkpointing_and_the_chunked_head_match(batches) -> None:
    moe = {"family": "qwen3_moe", "n_experts": 4, "n_experts_per_tok": 2, "moe_ffn_dim": 16}
    off = loss_and_grads(make_trainer(FULL_LOSS, **moe), batches)
    on = loss_and_grads(
        make_trainer(
            FULL_LOSS,
            **moe,
            ac={"mode": "selective", "targets": ["attention", "mlp"]},
            fused_lm_head_token_chunk_size=16,
        ),
        batches,
    )
    assert_same(on, off)
