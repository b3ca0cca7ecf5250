"""A TrainRequest split into TrainStream chunks joins back to the same request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest

from tidal.batch.train_chunks import join_request, split_request
from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import ResourceExhausted
from tidal.rpc.v1 import trainer_pb2 as pb

from ...helpers.micro_batches import wire_micro_batch


async def _stream(chunks: Iterable[pb.TrainChunk]) -> AsyncIterator[pb.TrainChunk]:
    for chunk in chunks:
        yield chunk


def _request() -> pb.TrainRequest:
    batches = [wire_micro_batch([40, 30]), wire_micro_batch([25])]
    return pb.TrainRequest(step=3, micro_batches=batches, loss=pb.LOSS_KIND_SFT)


@pytest.mark.parametrize("chunk_bytes", [1, 7, 100, 1 << 20])
def test_split_chunks_join_back_to_the_request(chunk_bytes: int) -> None:
    request = _request()
    chunks = list(split_request(request, chunk_bytes))
    total = len(request.SerializeToString())
    assert len(chunks) == -(-total // chunk_bytes)
    assert all(len(c.data) <= chunk_bytes and c.total_bytes == total for c in chunks)
    joined = asyncio.run(join_request(_stream(chunks), max_step_bytes=total, grpc=GrpcConfig()))
    assert joined == request


def test_a_request_over_the_step_cap_is_refused_on_its_first_chunk() -> None:
    request = _request()
    total = len(request.SerializeToString())
    chunks = split_request(request, 10)
    with pytest.raises(ResourceExhausted, match=r"^total_bytes: .*trainer.max_step_bytes"):
        asyncio.run(join_request(_stream(chunks), max_step_bytes=total - 1, grpc=GrpcConfig()))
