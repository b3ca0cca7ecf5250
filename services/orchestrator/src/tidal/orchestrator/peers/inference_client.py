"""Async client of the inference service (Generate, GetStatus, health).

Calls after start-up pass `wait_for_ready=False`: once a peer has been healthy, a dead
peer should fail the call within the channel's retry budget (UNAVAILABLE), not hang
until the call's deadline as wait-for-ready (the channel default) would make it.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.channel import make_channel
from tidal.common.security.transport import TransportSecurity
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.peers.client_errors import PeerError, peer_call, wait_serving
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import inference_pb2 as pb
from tidal.rpc.v1 import inference_pb2_grpc as pb_grpc

FULL_NAME = "tidal.rpc.v1.InferenceService"


@dataclass(frozen=True)
class ReplicaInfo:
    """What the orchestrator reads of a replica whenever it starts serving."""

    replica_id: str
    """Its id at weightsync (its loaded versions are filed under it)."""
    max_seq_len: int
    """The served context length: prompt plus completion, in tokens."""


def completion_from_proto(reply: pb.GenerateResponse) -> Completion:
    if not len(reply.token_ids) == len(reply.logprobs) == len(reply.policy_versions):
        raise PeerError(
            f"inference returned {len(reply.token_ids)} tokens, {len(reply.logprobs)} logprobs "
            f"and {len(reply.policy_versions)} policy versions for completion {reply.index}"
        )
    return Completion(
        index=reply.index,
        token_ids=tuple(reply.token_ids),
        logprobs=tuple(reply.logprobs),
        policy_versions=tuple(reply.policy_versions),
        stopped=reply.finish_reason == pb.FINISH_REASON_STOP,
    )


class InferenceClient:
    def __init__(
        self,
        address: str,
        grpc_config: GrpcConfig | None = None,
        *,
        security: TransportSecurity,
    ) -> None:
        self.address = address
        self.grpc_config = grpc_config
        self.security = security
        self.channel = make_channel(address, grpc_config, security=security)
        self.stub = pb_grpc.InferenceServiceStub(self.channel)

    def reconnect(self) -> grpc.aio.Channel:
        """Switch to a fresh channel (which connects at once, instead of after the old
        one's reconnect back-off, up to minutes); returns the old one for the caller to
        close once nothing uses it."""
        old = self.channel
        self.channel = make_channel(self.address, self.grpc_config, security=self.security)
        self.stub = pb_grpc.InferenceServiceStub(self.channel)
        return old

    async def serving(self, *, timeout: float) -> bool:
        """One fail-fast health Check: is the replica up and SERVING right now?"""
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=FULL_NAME),
                timeout=timeout,
                wait_for_ready=False,
            )
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def wait_serving(self, timeout: float) -> None:
        await wait_serving(self.channel, FULL_NAME, timeout, peer="inference", address=self.address)

    async def _status(self, timeout: float) -> pb.InferenceStatus:
        with peer_call("inference", self.address, "GetStatus"):
            return await self.stub.GetStatus(
                common_pb2.StatusRequest(), timeout=timeout, wait_for_ready=False
            )

    async def info(self, *, timeout: float = 10.0) -> ReplicaInfo:
        """The replica's id at weightsync and its context length."""
        status = await self._status(timeout)
        return ReplicaInfo(str(status.replica_id), int(status.max_seq_len))

    async def pressure(self, *, timeout: float = 10.0) -> tuple[int, float]:
        """(requests waiting in the replica's queue, fraction of its KV cache in use)."""
        status = await self._status(timeout)
        return int(status.queued), float(status.kv_usage)

    async def tokenizer(self, *, timeout: float = 10.0) -> common_pb2.TokenizerInfo:
        """The tokenizer the replica encodes and decodes with."""
        return (await self._status(timeout)).tokenizer

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        stop_token_ids: list[int],
        request_id: str = "",
        timeout: float = 300.0,
    ) -> list[Completion]:
        """All `n` completions of one prompt, ordered by index."""
        sampling = pb.SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            n=n,
            seed=seed,
            stop_token_ids=stop_token_ids,
        )
        request = pb.GenerateRequest(
            request_id=request_id, prompt_ids=prompt_ids, sampling=sampling
        )
        completions = []
        with peer_call("inference", self.address, "Generate"):
            async for reply in self.stub.Generate(request, timeout=timeout, wait_for_ready=False):
                completions.append(completion_from_proto(reply))
        if sorted(c.index for c in completions) != list(range(n)):
            raise PeerError(
                f"inference returned completions {sorted(c.index for c in completions)} "
                f"for n={n} (request {request_id})"
            )
        return sorted(completions, key=lambda c: c.index)

    async def close(self) -> None:
        await self.channel.close()
