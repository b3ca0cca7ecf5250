"""Truncation: samples are cut as specified; training on them equals training on cut samples."""

from __future__ import annotations

import pydantic
import pytest
import torch

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.trainer.config import ModelConfig
from tidal.trainer.memory.truncation import truncate_micro_batch
from tidal.trainer.memory_config import TruncationConfig

from .conftest import assert_same, loss_and_grads, make_trainer


def pack(samples: list[tuple[list[int], int, float]]) -> MicroBatchData:
    """(ids, prompt length, advantage) per sample → a packed micro-batch."""
    lengths = torch.tensor([len(ids) for ids, _, _ in samples])
    mask = torch.cat([(torch.arange(len(ids)) >= p).float() for ids, p, _ in samples])
    adv = torch.cat([torch.full((len(ids),), a) for ids, _, a in samples])
    ids = torch.tensor([t for s in samples for t in s[0]])
    return MicroBatchData(
        input_ids=ids,
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=adv * mask,
        behaviour_logprobs=-(ids.float() % 7 + 1) * mask,
    )


def test_prompt_keeps_its_end_and_completion_its_start() -> None:
    batch = pack([(list(range(10, 20)), 6, 1.0), (list(range(30, 35)), 2, -1.0)])
    cut = truncate_micro_batch(
        batch, TruncationConfig(max_prompt_tokens=3, max_completion_tokens=2)
    )
    assert cut.input_ids.tolist() == [13, 14, 15, 16, 17, 30, 31, 32, 33]
    assert cut.sample_lengths.tolist() == [5, 4]
    assert cut.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert cut.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]


def test_versions_are_cut_with_their_tokens() -> None:
    batch = pack([(list(range(10, 20)), 6, 1.0), (list(range(30, 35)), 2, -1.0)])
    batch = MicroBatchData(**{**batch.__dict__, "policy_versions": batch.input_ids % 3})
    cut = truncate_micro_batch(
        batch, TruncationConfig(max_prompt_tokens=3, max_completion_tokens=2)
    )
    assert cut.policy_versions is not None
    assert cut.policy_versions.tolist() == [t % 3 for t in cut.input_ids.tolist()]


def test_the_total_cap_cuts_the_completion_tail_first_then_the_prompt_head() -> None:
    batch = pack([(list(range(10, 20)), 6, 1.0), (list(range(30, 35)), 2, -1.0)])
    cut = truncate_micro_batch(batch, TruncationConfig(max_total_tokens=4))
    # sample 1: prompt 6 > 4 → its last 4 prompt tokens, no completion; sample 2: 2 + 2.
    assert cut.input_ids.tolist() == [12, 13, 14, 15, 30, 31, 32, 33]
    assert cut.loss_mask.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]


def test_without_caps_the_batch_is_untouched() -> None:
    batch = pack([(list(range(10, 20)), 6, 1.0)])
    assert truncate_micro_batch(batch, TruncationConfig()) is batch


def test_training_with_truncation_equals_training_on_the_cut_samples() -> None:
    full = [(list(range(40, 52)), 5, 0.7), (list(range(60, 69)), 3, -0.4)]
    cut = [(list(range(42, 49)), 3, 0.7), (list(range(60, 67)), 3, -0.4)]
    caps = {"max_prompt_tokens": 3, "max_completion_tokens": 4}
    on = loss_and_grads(make_trainer(truncation=caps), [pack(full)])
    reference = loss_and_grads(make_trainer(), [pack(cut)])
    assert_same(on, reference)


def test_a_zero_cap_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="max_prompt_tokens"):
        ModelConfig(truncation={"max_prompt_tokens": 0})


def test_step_metrics_count_the_tokens_kept() -> None:
    batch = pack([(list(range(10, 20)), 6, 1.0), (list(range(30, 35)), 2, -1.0)])
    trainer = make_trainer(truncation={"max_prompt_tokens": 3, "max_completion_tokens": 2})
    metrics = trainer.train_step(1, [batch], "pg")
    assert metrics["tokens"] == 9
    assert metrics["loss_tokens"] == 4
