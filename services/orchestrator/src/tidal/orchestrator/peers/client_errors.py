"""How calls to peers fail: a `PeerError` naming the peer, its address and the method.

`peer_call` turns a failed gRPC call into one, and `wait_serving` (the start-up wait for a
peer's health) fails the same way, so the orchestrator's exit message says which service
to look at.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.common.grpc.interceptors import ERROR_KIND_KEY


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
        kinds = [v for k, v in exc.trailing_metadata() or () if k == ERROR_KIND_KEY]
        raise PeerError(
            f"{peer} at {address}: {method} failed with {exc.code().name}: {exc.details()}",
            exc.code(),
            str(kinds[0]) if kinds else None,
        ) from exc


CHECK_INTERVAL_MAX_S = 0.1
"""The longest pause between two health Checks of a peer that is up but not SERVING."""


async def wait_serving(
    channel: grpc.aio.Channel, service: str, timeout: float, *, peer: str, address: str
) -> None:
    """Wait until `service` reports SERVING, for at most `timeout` seconds.

    Each health Check waits for the channel to connect (wait-for-ready) within the
    remaining deadline; a server that is up but NOT_SERVING yet (still loading) is asked
    again after a short back-off, capped at `CHECK_INTERVAL_MAX_S`: the wait is on the run's
    start-up path, where a longer cap lets a peer that became SERVING sit unnoticed, while
    a loopback Check costs about a millisecond.
    Check rather than Watch: tidal's error-mapping server
    interceptor does not pass grpc_health's Watch through (see the orchestrator report).
    """
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service=service)
    deadline = time.monotonic() + timeout
    delay = 0.05
    status = "UNKNOWN"
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            reply = await stub.Check(request, timeout=remaining, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                raise PeerError(
                    f"{peer} at {address}: health Check failed with {exc.code().name}: "
                    f"{exc.details()}"
                ) from exc
            status = exc.code().name
        else:
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, CHECK_INTERVAL_MAX_S)
    raise PeerError(f"{peer} at {address} not SERVING after {timeout:.0f}s (last: {status})")
