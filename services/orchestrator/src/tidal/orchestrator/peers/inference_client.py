"""Async client of the inference service (Generate, Score, WatchOccupancy, GetStatus, health)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.orchestrator.completions import Completion
from tidal.orchestrator.peers.peer_client import PeerClient, PeerError, peer_call
from tidal.rpc.v1 import inference_pb2 as pb
from tidal.rpc.v1 import inference_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class ReplicaInfo:
    """What the orchestrator reads of a replica whenever it starts serving."""

    replica_id: str
    """Its id at weightsync (its loaded versions are filed under it)."""
    max_seq_len: int
    """The served context length: prompt plus completion, in tokens."""


@dataclass(frozen=True)
class ReplicaOccupancy:
    """What a replica pushed last on WatchOccupancy, and when it arrived."""

    queued: int
    """Requests waiting for a batch there."""
    running: int
    kv_usage: float
    """Fraction of its KV cache in use, [0, 1]."""
    received_at: float
    """time.monotonic() when it arrived."""
    replica_id: str = ""
    """The replica's id at weightsync, as GetStatus reports it (new after a restart)."""


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


class InferenceClient(PeerClient):
    peer = "inference"
    service = "tidal.rpc.v1.InferenceService"
    stub_class = pb_grpc.InferenceServiceStub

    async def serving(self, *, timeout: float) -> bool:
        """One fail-fast health Check: is the replica up and SERVING right now?"""
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=self.service),
                timeout=timeout,
                wait_for_ready=False,
            )
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def info(self, *, timeout: float = 10.0) -> ReplicaInfo:
        """The replica's id at weightsync and its context length."""
        status = await self._status(timeout)
        return ReplicaInfo(str(status.replica_id), int(status.max_seq_len))

    async def watch_occupancy(
        self, *, min_interval_ms: int, heartbeat_ms: int
    ) -> AsyncIterator[ReplicaOccupancy]:
        """The replica's pushed occupancy until the stream ends; a failed stream raises
        `PeerError`. Cancelling the iteration cancels the call."""
        request = pb.WatchOccupancyRequest(
            min_interval_ms=min_interval_ms, heartbeat_ms=heartbeat_ms
        )
        call = self.stub.WatchOccupancy(request, wait_for_ready=False)
        try:
            with peer_call(self.peer, self.address, "WatchOccupancy"):
                async for report in call:
                    yield ReplicaOccupancy(
                        queued=report.queued,
                        running=report.running,
                        kv_usage=report.kv_usage,
                        received_at=time.monotonic(),
                        replica_id=report.replica_id,
                    )
        finally:
            call.cancel()

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

    async def score(
        self, token_ids: list[int], *, start: int, request_id: str = "", timeout: float = 300.0
    ) -> tuple[float, ...]:
        """The served weights' logprob of each of `token_ids[start:]` given the tokens
        before it (Score; nothing sampled)."""
        request = pb.ScoreRequest(request_id=request_id, token_ids=token_ids, start=start)
        with peer_call("inference", self.address, "Score"):
            reply = await self.stub.Score(request, timeout=timeout, wait_for_ready=False)
        if len(reply.logprobs) != len(token_ids) - start:
            raise PeerError(
                f"inference at {self.address} scored {len(reply.logprobs)} tokens of "
                f"{len(token_ids) - start} (request {request_id})"
            )
        return tuple(reply.logprobs)
