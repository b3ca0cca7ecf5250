"""The `MicroBatch` message (trainer.proto) ⇄ `PackedMicroBatch` (numpy), both ends' codec.

`WIRE_DTYPES` is the contract's dtype of each tensor: encoding casts to it, decoding
refuses any other with InvalidArgument naming the field rather than converting what the
sender got wrong. Decoded arrays are read-only views of the message's bytes. Beyond
dtypes nothing is checked here: the trainer validates shapes, values and the rank, where
it knows its vocabulary and data-parallel degree. numpy only, so the orchestrator uses it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from tidal.batch.packing import PackedMicroBatch
from tidal.batch.tensor_codec import decode_array, encode_array
from tidal.common.errors import InvalidArgument
from tidal.rpc.v1 import trainer_pb2

WIRE_DTYPES: dict[str, str] = {
    "input_ids": "int32",
    "position_ids": "int32",
    "sample_lengths": "int32",
    "loss_mask": "float32",
    "advantages": "float32",
    "behaviour_logprobs": "float32",
}
OPTIONAL_WIRE_DTYPES: dict[str, str] = {"policy_versions": "int32", "sample_parents": "int32"}
"""Tensors a sender may leave unset (decoded as None, left out of the payload hash)."""


def micro_batch_to_proto(batch: PackedMicroBatch) -> trainer_pb2.MicroBatch:
    """Encode every tensor in its contract dtype, and the rank."""
    return trainer_pb2.MicroBatch(
        rank=batch.rank,
        **{
            name: encode_array(np.asarray(getattr(batch, name), dtype=dtype))
            for name, dtype in (WIRE_DTYPES | OPTIONAL_WIRE_DTYPES).items()
            if getattr(batch, name) is not None
        },
    )


def micro_batch_from_proto(message: trainer_pb2.MicroBatch, *, field: str) -> PackedMicroBatch:
    """Decode; raises InvalidArgument(`{field}.<tensor>...`) for a missing or mistyped tensor."""
    arrays: dict[str, np.ndarray | None] = {}
    for name, dtype in (WIRE_DTYPES | OPTIONAL_WIRE_DTYPES).items():
        if not message.HasField(name):
            if name in OPTIONAL_WIRE_DTYPES:
                arrays[name] = None
                continue
            raise InvalidArgument(f"{field}.{name}", "is missing")
        tensor = getattr(message, name)
        if tensor.dtype != dtype:
            raise InvalidArgument(f"{field}.{name}.dtype", f"must be {dtype}, got {tensor.dtype!r}")
        arrays[name] = decode_array(tensor, field=f"{field}.{name}")
    return PackedMicroBatch(**arrays, rank=message.rank)  # type: ignore[arg-type]


def token_counts(messages: Sequence[trainer_pb2.MicroBatch], *, field: str) -> list[int]:
    """Each micro-batch's token count T, read from its `input_ids` shape without decoding
    anything, so a step's size can be refused before it costs memory. Raises
    InvalidArgument(`{field}[i].input_ids.shape`) unless the shape is one non-negative dim."""
    counts = []
    for i, message in enumerate(messages):
        if not message.HasField("input_ids"):
            raise InvalidArgument(f"{field}[{i}].input_ids", "is missing")
        shape = list(message.input_ids.shape)
        if len(shape) != 1 or shape[0] < 0:
            raise InvalidArgument(
                f"{field}[{i}].input_ids.shape", f"must be [T] with T >= 0, got {shape}"
            )
        counts.append(int(shape[0]))
    return counts


def payload_sha256(loss: int, micro_batches: Sequence[trainer_pb2.MicroBatch]) -> bytes:
    """The fingerprint of a Train payload: sha256 over the loss kind and, for every
    micro-batch in order, its rank and every tensor's name, dtype, shape and bytes.
    Hashing field by field (not the serialized message) keeps it independent of
    protobuf's serializer; sender and trainer both call this on the messages they hold."""
    digest = hashlib.sha256(f"loss={loss};n={len(micro_batches)}".encode())
    for message in micro_batches:
        digest.update(f";rank={message.rank}".encode())
        for name in WIRE_DTYPES | OPTIONAL_WIRE_DTYPES:
            if name in OPTIONAL_WIRE_DTYPES and not message.HasField(name):
                continue
            tensor = getattr(message, name)
            shape = ",".join(str(d) for d in tensor.shape)
            digest.update(f";{name}:{tensor.dtype}:[{shape}]:{len(tensor.data)}:".encode())
            digest.update(tensor.data)
    return digest.digest()
