"""The torch micro-batch: converted from the packed numpy one, validated naming the field."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tidal.batch.packing import TrainSample, build_micro_batch
from tidal.batch.tensors import (
    MicroBatchData,
    micro_batch_from_packed,
    positions_for,
    prediction_index,
    validate_micro_batch,
)
from tidal.batch.wire import micro_batch_from_proto, micro_batch_to_proto
from tidal.common.errors import InvalidArgument

VOCAB, MAX_LEN = 264, 8


def good_batch() -> MicroBatchData:
    lengths = torch.tensor([3, 5])
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 1, 1], dtype=torch.float32)
    return MicroBatchData(
        input_ids=torch.tensor([256, 1, 2, 256, 3, 4, 5, 257]),
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=mask * 0.5,
        behaviour_logprobs=mask * -1.0,
    )


def check(batch: MicroBatchData) -> None:
    validate_micro_batch(batch, field="micro_batches[1]", vocab_size=VOCAB, max_seq_len=MAX_LEN)


def test_positions_restart_per_sample() -> None:
    assert positions_for(torch.tensor([3, 1, 2])).tolist() == [0, 1, 2, 0, 0, 1]


def test_a_well_formed_batch_passes() -> None:
    check(good_batch())


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"input_ids": torch.tensor([256, 1, 2, 256, 3, 4, 5, 264])}, "input_ids", "token id 264"),
        ({"input_ids": torch.tensor([-1, 1, 2, 256, 3, 4, 5, 7])}, "input_ids", "vocabulary"),
        ({"advantages": torch.zeros(7)}, "advantages", "has 7 entries"),
        ({"loss_mask": torch.zeros(2, 4)}, "loss_mask", "1-D"),
        ({"sample_lengths": torch.tensor([3, 4])}, "sample_lengths", "sums to 7"),
        ({"sample_lengths": torch.tensor([0, 8])}, "sample_lengths", "at least 1 token"),
        ({"sample_lengths": torch.tensor([], dtype=torch.int64)}, "sample_lengths", "S >= 1"),
        ({"position_ids": torch.arange(8)}, "position_ids", "within each sample"),
        ({"loss_mask": torch.tensor([1.0, 1, 1, 0, 0, 1, 1, 1])}, "loss_mask", "first token"),
        ({"loss_mask": torch.full((8,), 0.5)}, "loss_mask", "0 or 1"),
        ({"behaviour_logprobs": torch.full((8,), float("nan"))}, "behaviour_logprobs", "NaN"),
    ],
)
def test_bad_batches_name_the_field(change: dict, field: str, words: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument) as err:
        check(replace(good_batch(), **change))
    assert err.value.field == f"micro_batches[1].{field}"
    assert words in str(err.value)


def test_samples_longer_than_the_model_are_refused_but_the_pack_may_be_longer() -> None:
    long_pack = torch.tensor([8, 8])  # T = 16 > max_seq_len: fine
    mask = torch.ones(16)
    mask[[0, 8]] = 0
    batch = MicroBatchData(
        torch.zeros(16, dtype=torch.int64),
        positions_for(long_pack),
        long_pack,
        mask,
        torch.zeros(16),
        torch.zeros(16),
    )
    check(batch)
    too_long = torch.tensor([9, 7])
    with pytest.raises(InvalidArgument, match="9 tokens, more than the model's max_seq_len 8"):
        check(replace(batch, sample_lengths=too_long, position_ids=positions_for(too_long)))


def test_a_packed_batch_converts_to_int64_ids_and_fp32_values() -> None:
    packed = build_micro_batch([TrainSample((256, 1, 2), (3, 4, 257), advantage=0.5)])
    batch = micro_batch_from_packed(packed)
    assert [t.dtype for t in (batch.input_ids, batch.position_ids, batch.sample_lengths)] == [
        torch.int64
    ] * 3
    assert {t.dtype for t in (batch.loss_mask, batch.advantages, batch.behaviour_logprobs)} == {
        torch.float32
    }
    assert batch.input_ids.tolist() == [256, 1, 2, 3, 4, 257]
    assert batch.loss_mask.tolist() == [0, 0, 0, 1, 1, 1]
    check(batch)


def test_a_batch_decoded_from_the_wire_owns_writable_memory() -> None:
    packed = build_micro_batch([TrainSample((256, 1), (2,), advantage=1.0)])
    decoded = micro_batch_from_proto(micro_batch_to_proto(packed), field="micro_batches[0]")
    batch = micro_batch_from_packed(decoded)
    batch.advantages.mul_(2)  # a view of the request's read-only bytes could not be written
    assert batch.advantages.tolist() == [2.0, 2.0, 2.0]


def test_the_rank_survives_conversion_and_moving_to_a_device() -> None:
    packed = build_micro_batch([TrainSample((256, 1), (2,), advantage=1.0)], rank=3)
    batch = micro_batch_from_packed(packed)
    assert batch.rank == 3
    assert batch.to("cpu").rank == 3


def shared_batch() -> MicroBatchData:
    """A prompt of 3 tokens shared by completions of 2 and 1 tokens, then a lone sample."""
    packed = build_micro_batch(
        [
            TrainSample((256, 1, 2), (3, 4), advantage=0.5, completion_logprobs=(-1.0, -2.0)),
            TrainSample((256, 1, 2), (5,), advantage=1.5, completion_logprobs=(-3.0,)),
            TrainSample((256, 6), (7,), advantage=1.0, completion_logprobs=(-4.0,)),
        ],
        share_prompts=True,
    )
    return micro_batch_from_packed(packed)


def test_positions_continue_after_the_parent() -> None:
    batch = shared_batch()
    assert batch.sample_parents is not None
    assert positions_for(batch.sample_lengths, batch.sample_parents).tolist() == [
        0, 1, 2, 3, 4, 3, 0, 1, 2,
    ]  # fmt: skip
    check(batch)


def test_a_child_first_token_is_predicted_at_its_parent_last() -> None:
    batch = shared_batch()
    index = prediction_index(batch.sample_lengths, batch.sample_parents)
    assert index is not None  # rows scoring tokens 1..8: the 2nd child's first token at 2
    assert index.tolist() == [0, 1, 2, 3, 2, 5, 6, 7]
    assert prediction_index(good_batch().sample_lengths, None) is None


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ([-1, 1, 0, -1], "earlier sample"),
        ([-1, 0, 1, -1], "parent itself"),
        ([-1, 0, 0], "must be \\[S\\]"),
    ],
)
def test_bad_parents_are_refused_naming_the_field(parents: list[int], message: str) -> None:
    batch = replace(shared_batch(), sample_parents=torch.tensor(parents))
    with pytest.raises(InvalidArgument, match=message) as info:
        check(batch)
    assert "micro_batches[1].sample_parents" in str(info.value)


def test_a_loss_token_in_a_shared_prompt_is_refused() -> None:
    batch = shared_batch()
    mask = batch.loss_mask.clone()
    mask[1] = 1.0
    with pytest.raises(InvalidArgument, match="parent sample"):
        check(replace(batch, loss_mask=mask))


def test_positions_that_restart_at_a_child_are_refused() -> None:
    batch = shared_batch()
    with pytest.raises(InvalidArgument, match="position_ids"):
        check(replace(batch, position_ids=positions_for(batch.sample_lengths)))


def test_a_child_longer_than_the_model_with_its_parent_is_refused() -> None:
    batch = shared_batch()  # a 3-token prompt and a 2-token completion: 5 positions
    with pytest.raises(InvalidArgument, match="max_seq_len 4"):
        validate_micro_batch(batch, field="mb", vocab_size=VOCAB, max_seq_len=4)
