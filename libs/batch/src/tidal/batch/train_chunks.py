"""A `TrainRequest` as a TrainStream's chunks, and back: both ends' codec.

The request is serialized once and cut into pieces of its bytes, so a step of any size
crosses in messages under the server's small receive limit and the trainer parses and
checks exactly what Train would. The receiving end checks every chunk before keeping it:
the declared total against `trainer.max_step_bytes` (on the first chunk, before any data
is kept), each chunk's size against `max_chunk_bytes`, and that each starts where the
last ended; each refusal names the `TrainChunk` field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from google.protobuf.message import DecodeError

from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import InvalidArgument, ResourceExhausted
from tidal.common.grpc.limits import check_chunk_size
from tidal.rpc.v1 import trainer_pb2


def split_request(
    request: trainer_pb2.TrainRequest, chunk_bytes: int
) -> Iterator[trainer_pb2.TrainChunk]:
    """The `TrainChunk`s of `request`, each carrying at most `chunk_bytes`."""
    raw = memoryview(request.SerializeToString())
    total = len(raw)
    for offset in range(0, total, chunk_bytes):
        yield trainer_pb2.TrainChunk(
            total_bytes=total, offset=offset, data=bytes(raw[offset : offset + chunk_bytes])
        )


async def join_request(
    chunks: AsyncIterator[trainer_pb2.TrainChunk], *, max_step_bytes: int, grpc: GrpcConfig
) -> trainer_pb2.TrainRequest:
    """The request the chunks carry; InvalidArgument or ResourceExhausted naming the field
    of the first chunk that breaks the stream's rules."""
    parts: list[bytes] = []
    received = 0
    total = -1
    async for chunk in chunks:
        if total < 0:
            total = _declared_total(chunk.total_bytes, max_step_bytes)
        elif chunk.total_bytes != total:
            raise InvalidArgument(
                "total_bytes", f"{chunk.total_bytes}, but the stream's first chunk said {total}"
            )
        check_chunk_size("data", len(chunk.data), grpc)
        if not chunk.data:
            raise InvalidArgument("data", "a chunk must carry at least one byte")
        if chunk.offset != received:
            raise InvalidArgument(
                "offset",
                f"chunks arrive in order, each where the last ended: expected {received}, "
                f"got {chunk.offset}",
            )
        if received + len(chunk.data) > total:
            raise InvalidArgument(
                "data", f"the chunks run past total_bytes ({total}) at offset {received}"
            )
        parts.append(chunk.data)
        received += len(chunk.data)
    if total < 0:
        raise InvalidArgument("total_bytes", "the stream carried no chunk")
    if received != total:
        raise InvalidArgument(
            "total_bytes", f"the stream ended after {received} of its {total} bytes"
        )
    try:
        return trainer_pb2.TrainRequest.FromString(b"".join(parts))
    except DecodeError:
        raise InvalidArgument("data", "the chunks together are no TrainRequest") from None


def _declared_total(total: int, max_step_bytes: int) -> int:
    if total <= 0:
        raise InvalidArgument("total_bytes", f"must be positive, got {total}")
    if total > max_step_bytes:
        raise ResourceExhausted(
            f"total_bytes: a request of {total} bytes, more than the {max_step_bytes} the "
            "trainer takes (trainer.max_step_bytes); send fewer samples per step or raise it"
        )
    return total
