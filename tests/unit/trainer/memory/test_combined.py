"""LoRA under the other levers: the same loss and adapter gradients as LoRA alone."""

from __future__ import annotations

import functools

import pytest

import tidal.trainer.train_step as train_step
from tidal.trainer.memory.activation_offload import activation_offloading

from .conftest import FULL_LOSS, assert_same, loss_and_grads, make_trainer
from .test_lora import LORA, randomise_adapters


def test_lora_with_checkpointing_offloading_and_the_chunked_head(
    batches, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        train_step,
        "activation_offloading",
        functools.partial(activation_offloading, copy_on_cpu=True),
    )
    alone = make_trainer(FULL_LOSS, lora=LORA)
    combined = make_trainer(
        FULL_LOSS,
        lora=LORA,
        ac={"mode": "selective", "targets": ["attention", "mlp"]},
        ac_offloading={"min_offload_bytes": 0},
        fused_lm_head_token_chunk_size=16,
        truncation={"max_total_tokens": 64},  # longer than every sample: cuts nothing
    )
    randomise_adapters(alone.model)
    randomise_adapters(combined.model)
    assert_same(loss_and_grads(combined, batches), loss_and_grads(alone, batches))
