"""The MicroBatch codec: what the orchestrator encodes, the trainer decodes unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from tidal.batch.packing import TrainSample, build_micro_batch
from tidal.batch.tensor_codec import encode_array
from tidal.batch.wire import (
    WIRE_DTYPES,
    micro_batch_from_proto,
    micro_batch_to_proto,
    payload_sha256,
)
from tidal.common.errors import InvalidArgument

SAMPLES = [
    TrainSample((256, 1, 2), (3, 4), advantage=0.5, completion_logprobs=(-0.1, -0.2)),
    TrainSample((256, 7), (8, 257), advantage=-1.0, completion_mask=(1.0, 0.0)),
]


def test_a_packed_micro_batch_round_trips_through_the_message() -> None:
    packed = build_micro_batch(SAMPLES)
    decoded = micro_batch_from_proto(micro_batch_to_proto(packed), field="micro_batches[0]")
    for name in WIRE_DTYPES:
        np.testing.assert_array_equal(getattr(decoded, name), getattr(packed, name))
        assert getattr(decoded, name).dtype.name == WIRE_DTYPES[name]


def test_encoding_casts_every_field_to_its_contract_dtype() -> None:
    packed = build_micro_batch(SAMPLES)
    packed.input_ids = packed.input_ids.astype(np.int64)
    message = micro_batch_to_proto(packed)
    assert {name: getattr(message, name).dtype for name in WIRE_DTYPES} == WIRE_DTYPES


def test_a_missing_tensor_is_named() -> None:
    message = micro_batch_to_proto(build_micro_batch(SAMPLES))
    message.ClearField("loss_mask")
    with pytest.raises(InvalidArgument, match=r"micro_batches\[3\]\.loss_mask.*missing"):
        micro_batch_from_proto(message, field="micro_batches[3]")


def test_a_tensor_of_another_dtype_is_refused_not_converted() -> None:
    message = micro_batch_to_proto(build_micro_batch(SAMPLES))
    message.input_ids.CopyFrom(encode_array(np.arange(7, dtype=np.int64)))
    with pytest.raises(InvalidArgument, match=r"input_ids\.dtype.*must be int32.*int64"):
        micro_batch_from_proto(message, field="micro_batches[0]")


def test_the_rank_round_trips_and_an_unset_rank_is_rank_0() -> None:
    message = micro_batch_to_proto(build_micro_batch(SAMPLES, rank=2))
    assert message.rank == 2
    assert micro_batch_from_proto(message, field="micro_batches[0]").rank == 2
    message.ClearField("rank")  # a sender that does not know ranks
    assert micro_batch_from_proto(message, field="micro_batches[0]").rank == 0


def test_the_payload_fingerprint_covers_the_rank() -> None:
    on_0 = micro_batch_to_proto(build_micro_batch(SAMPLES, rank=0))
    on_1 = micro_batch_to_proto(build_micro_batch(SAMPLES, rank=1))
    assert payload_sha256(1, [on_0]) != payload_sha256(1, [on_1])


def test_policy_versions_round_trip_and_an_unset_field_decodes_as_unknown() -> None:
    samples = [
        TrainSample((256, 1), (3, 4, 5), advantage=1.0, completion_versions=(2, 2, 3)),
        TrainSample((256,), (8, 9), advantage=0.0, completion_versions=(3, -1)),
    ]
    packed = build_micro_batch(samples)
    np.testing.assert_array_equal(packed.policy_versions, [-1, -1, 2, 2, 3, -1, 3, -1])
    message = micro_batch_to_proto(packed)
    decoded = micro_batch_from_proto(message, field="micro_batches[0]")
    np.testing.assert_array_equal(decoded.policy_versions, packed.policy_versions)
    assert decoded.policy_versions.dtype.name == "int32"
    digest = payload_sha256(1, [message])
    message.ClearField("policy_versions")  # a sender that does not know versions
    assert micro_batch_from_proto(message, field="micro_batches[0]").policy_versions is None
    assert payload_sha256(1, [message]) != digest
    packed.policy_versions = None
    assert not micro_batch_to_proto(packed).HasField("policy_versions")


def test_sample_parents_round_trip_and_are_left_out_when_unset() -> None:
    shared = build_micro_batch([SAMPLES[0], SAMPLES[0], SAMPLES[1]], share_prompts=True)
    decoded = micro_batch_from_proto(micro_batch_to_proto(shared), field="micro_batches[0]")
    assert decoded.sample_parents is not None
    assert decoded.sample_parents.tolist() == [-1, 0, 0, -1]
    assert not micro_batch_to_proto(build_micro_batch(SAMPLES)).HasField("sample_parents")
