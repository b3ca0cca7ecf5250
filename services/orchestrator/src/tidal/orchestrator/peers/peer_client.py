"""A client of one peer service, and how its calls fail: a `PeerError` naming the peer,
its address and the method.

`peer_call` turns a failed gRPC call into one, and `PeerClient.wait_serving` (the start-up
wait for a peer's health) fails the same way, so the orchestrator's exit message says which
service to look at. Calls after start-up pass `wait_for_ready=False`: once a peer has been
healthy, a dead peer should fail the call within the channel's retry budget (UNAVAILABLE),
not hang until the call's deadline as wait-for-ready (the channel default) would make it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.interceptors import reported_kind
from tidal.common.security.transport import TransportSecurity
from tidal.rpc.v1 import common_pb2


class PeerError(RuntimeError):
    """A call to inference, the trainer or weightsync failed (`code`: its gRPC status,
    None when it did not come from a call, e.g. a peer not SERVING in time)."""

    def __init__(
        self, message: str, code: grpc.StatusCode | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind
        """The peer's domain error class (`DiskFull`), when it said."""


@contextmanager
def peer_call(peer: str, address: str, method: str) -> Iterator[None]:
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise PeerError(
            f"{peer} at {address}: {method} failed with {exc.code().name}: {exc.details()}",
            exc.code(),
            reported_kind(exc),
        ) from exc


CHECK_INTERVAL_MAX_S = 0.1
"""The longest pause between two health Checks of a peer that is up but not SERVING."""


class PeerClient:
    """A channel to one peer service and the calls every peer answers: health, GetStatus."""

    peer: ClassVar[str]
    """The peer's name in errors ("inference")."""
    service: ClassVar[str]
    """Its full gRPC service name, as its health service knows it."""
    stub_class: ClassVar[type[Any]]

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
        self.stub = self.stub_class(self.channel)

    def reconnect(self) -> grpc.aio.Channel:
        """Switch to a fresh channel (which connects at once, instead of after the old
        one's reconnect back-off, up to minutes); returns the old one for the caller to
        close once nothing uses it."""
        old = self.channel
        self.channel = make_channel(self.address, self.grpc_config, security=self.security)
        self.stub = self.stub_class(self.channel)
        return old

    async def wait_serving(self, timeout: float) -> None:
        """Wait until the peer reports SERVING, for at most `timeout` seconds.

        Each health Check waits for the channel to connect (wait-for-ready) within the
        remaining deadline; a server that is up but NOT_SERVING yet (still loading) is asked
        again after a short back-off, capped at `CHECK_INTERVAL_MAX_S`: the wait is on the
        run's start-up path, where a longer cap lets a peer that became SERVING sit
        unnoticed, while a loopback Check costs about a millisecond.
        Check rather than Watch: tidal's error-mapping server
        interceptor does not pass grpc_health's Watch through (see the orchestrator report).
        """
        stub = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service=self.service)
        deadline = time.monotonic() + timeout
        delay = 0.05
        status = "UNKNOWN"
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                reply = await stub.Check(request, timeout=remaining, wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    raise PeerError(
                        f"{self.peer} at {self.address}: health Check failed with "
                        f"{exc.code().name}: {exc.details()}"
                    ) from exc
                status = exc.code().name
            else:
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, CHECK_INTERVAL_MAX_S)
        raise PeerError(
            f"{self.peer} at {self.address} not SERVING after {timeout:.0f}s (last: {status})"
        )

    async def _status(self, timeout: float) -> Any:
        with peer_call(self.peer, self.address, "GetStatus"):
            return await self.stub.GetStatus(
                common_pb2.StatusRequest(), timeout=timeout, wait_for_ready=False
            )

    async def tokenizer(self, *, timeout: float = 10.0) -> common_pb2.TokenizerInfo:
        """The tokenizer the peer encodes and decodes with."""
        return (await self._status(timeout)).tokenizer

    async def close(self) -> None:
        await self.channel.close()
