"""torch.compile per block: same loss and gradients, alone and under the other levers."""

from __future__ import annotations

import functools

import pydantic
import pytest

import tidal.trainer.train_step as train_step
from tidal.trainer.config import ModelConfig
from tidal.trainer.memory.activation_offload import activation_offloading

from .conftest import FULL_LOSS, assert_same, loss_and_grads, make_trainer

# aot_eager traces and partitions like inductor without its C++ codegen, which takes
# minutes on 2 cores (inductor parity was checked by hand: docs/memory.md).
FAST = {"backend": "aot_eager"}


def test_compiled_blocks_give_the_same_loss_and_gradients(batches) -> None:
    off = loss_and_grads(make_trainer(FULL_LOSS), batches)
    trainer = make_trainer(FULL_LOSS, compile=FAST)
    names = [n for n, _ in trainer.model.named_parameters()]
    assert names == [n for n, _ in make_trainer().model.named_parameters()]
    assert_same(loss_and_grads(trainer, batches), off)


def test_the_memory_tight_combination_gives_the_same_loss_and_gradients(
    batches, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpointing (every other block) → compile, offloading, chunked head, together."""
    monkeypatch.setattr(
        train_step,
        "activation_offloading",
        functools.partial(activation_offloading, copy_on_cpu=True),
    )
    off = loss_and_grads(make_trainer(FULL_LOSS), batches)
    on = loss_and_grads(
        make_trainer(
            FULL_LOSS,
            ac={"freq": 2},
            compile=FAST,
            ac_offloading={"max_inflight_activations": 2, "min_offload_bytes": 0},
            fused_lm_head_token_chunk_size=8,
        ),
        batches,
    )
    assert_same(on, off)


def test_the_chunked_head_on_transformers_models_is_a_config_error_naming_both_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"fused_lm_head_token_chunk_size.*impl"):
        ModelConfig(impl="hf", fused_lm_head_token_chunk_size=64)
