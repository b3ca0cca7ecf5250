"""Async client of the trainer service: Train with packed micro-batches, status, health.

A step crosses as TrainStream's chunks (`tidal.batch.train_chunks`), each under the
server's receive limit, whatever the step's size.

Train carries the payload's sha256: the trainer answers a repeated step id from its
record only when the data are the same, and refuses (FAILED_PRECONDITION) a step id it
already trained with other data. That error propagates: the step, and the run, fail.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from tidal.batch.packing import PackedMicroBatch
from tidal.batch.train_chunks import split_request
from tidal.batch.wire import micro_batch_to_proto, payload_sha256
from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import DiskFull
from tidal.common.grpc.limits import max_chunk_bytes
from tidal.orchestrator.peers.peer_client import PeerClient, PeerError, peer_call
from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class TrainResult:
    step: int
    policy_version: int
    metrics: dict[str, float]
    duplicate: bool


def train_request(
    step: int, micro_batches: Sequence[PackedMicroBatch], *, sft: bool
) -> pb.TrainRequest:
    """Step `step`'s Train request, carrying its payload's sha256."""
    loss = pb.LOSS_KIND_SFT if sft else pb.LOSS_KIND_POLICY_GRADIENT
    messages = [micro_batch_to_proto(b) for b in micro_batches]
    return pb.TrainRequest(
        step=step, micro_batches=messages, loss=loss, payload_sha256=payload_sha256(loss, messages)
    )


class TrainerClient(PeerClient):
    peer = "trainer"
    service = "tidal.rpc.v1.TrainerService"
    stub_class = pb_grpc.TrainerServiceStub

    async def last_step(self, *, timeout: float = 10.0) -> int:
        """The last step the trainer has trained (0 before any). Raises `DiskFull` when
        that step's checkpoint or version could not be written for want of space: its
        version will not be published, and no later step trained, until space is freed."""
        status = await self._status(timeout)
        if status.write_error_disk_full:
            raise DiskFull.reported(self.peer, status.write_error)
        return int(status.step)

    async def check_disk(self) -> None:
        """Raise `DiskFull` as `last_step` does; a trainer out of reach is not an error
        here (the callers that need it wait for it)."""
        with contextlib.suppress(PeerError):
            await self.last_step()

    async def data_parallel_ranks(self, *, timeout: float = 10.0) -> int:
        """The trainer's data-parallel degree (0 from a trainer that does not report it)."""
        return int((await self._status(timeout)).data_parallel_ranks)

    async def train(
        self,
        step: int,
        micro_batches: Sequence[PackedMicroBatch],
        *,
        sft: bool,
        timeout: float = 600.0,
    ) -> TrainResult:
        return await self.send(train_request(step, micro_batches, sft=sft), timeout=timeout)

    async def send(self, request: pb.TrainRequest, *, timeout: float = 600.0) -> TrainResult:
        """Send a built Train request (the same request again is a retry: same fingerprint)."""
        chunks = split_request(request, max_chunk_bytes(self.grpc_config or GrpcConfig()))
        method = f"TrainStream(step={request.step})"
        try:
            with peer_call("trainer", self.address, method):
                reply = await self.stub.TrainStream(chunks, timeout=timeout, wait_for_ready=False)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this send itself was cancelled
            # grpc.aio cancels a request stream whose server died while it was being sent:
            # the trainer is gone, as UNAVAILABLE says (the delivery rides it out)
            raise PeerError(
                f"trainer at {self.address}: {method} cancelled under its sender",
                code=grpc.StatusCode.UNAVAILABLE,
            ) from None
        return TrainResult(
            step=int(reply.step),
            policy_version=int(reply.policy_version),
            metrics=dict(reply.metrics),
            duplicate=reply.duplicate,
        )
