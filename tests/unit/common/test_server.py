"""The shared gRPC server helper: error mapping, request ids, health and graceful stop.

A throwaway servicer stands in for a service here: what is under test is the server
helper and its interceptor, which every real service shares.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import (
    DiskFull,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.interceptors import ERROR_KIND_KEY
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.observability.logging import request_id_var
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.rpc.v1 import common_pb2, orchestrator_pb2, orchestrator_pb2_grpc

FAILURES = {
    "invalid": InvalidArgument("sampling.n", "must be > 0"),
    "state": FailedPrecondition("no weights loaded yet"),
    "full": ResourceExhausted("queue is full"),
    "disk": DiskFull(Path("/run/checkpoints/step_3"), 5 << 20),
    "bug": ZeroDivisionError("division by zero"),
}


class Raising(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    """Fails as the `fail` metadata says; otherwise answers with the request id it saw."""

    async def GetProgress(self, request, context):  # type: ignore[no-untyped-def]
        fail = dict(context.invocation_metadata()).get("fail")
        if fail:
            raise FAILURES[fail]
        return orchestrator_pb2.Progress(state=request_id_var.get())


@pytest.fixture
async def server():  # type: ignore[no-untyped-def]
    binding = ServiceBinding(
        Raising(),
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server,
        "tidal.rpc.v1.OrchestratorService",
    )
    server = GrpcServer(
        "127.0.0.1:0", [binding], GrpcConfig(shutdown_grace_s=0.2), security=PLAINTEXT_LOOPBACK
    )
    await server.start()
    yield server
    await server.stop()


async def _call(server: GrpcServer, **metadata: str) -> orchestrator_pb2.Progress:
    async with make_channel(f"127.0.0.1:{server.port}", security=PLAINTEXT_LOOPBACK) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
        return await stub.GetProgress(
            common_pb2.StatusRequest(), metadata=tuple(metadata.items()), timeout=5
        )


@pytest.mark.parametrize(
    ("fail", "code", "text"),
    [
        ("invalid", grpc.StatusCode.INVALID_ARGUMENT, "sampling.n: must be > 0"),
        ("state", grpc.StatusCode.FAILED_PRECONDITION, "no weights loaded yet"),
        ("full", grpc.StatusCode.RESOURCE_EXHAUSTED, "queue is full"),
        ("bug", grpc.StatusCode.INTERNAL, "internal error "),
    ],
)
async def test_domain_errors_map_to_their_status_and_server_keeps_serving(
    server: GrpcServer,
    fail: str,
    code: grpc.StatusCode,
    text: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO), pytest.raises(grpc.aio.AioRpcError) as err:
        await _call(server, fail=fail)
    details = err.value.details() or ""
    assert err.value.code() == code and text in details
    if code == grpc.StatusCode.INTERNAL:
        # The caller gets only an id; the traceback is logged under that id.
        assert "ZeroDivision" not in details and "division" not in details
        error_id = details.removeprefix("internal error ")
        logged = [r for r in caplog.records if error_id in r.getMessage()]
        assert logged and logged[0].exc_info is not None
    assert (await _call(server, **{"x-request-id": "after"})).state == "after"


async def test_a_full_disk_is_resource_exhausted_naming_the_path_and_its_kind(
    server: GrpcServer,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _call(server, fail="disk")
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "disk full: /run/checkpoints/step_3 could not be written" in details
    assert "at least 5.0 MiB needed" in details and "free on its filesystem" in details
    kinds = [v for k, v in err.value.trailing_metadata() or () if k == ERROR_KIND_KEY]
    assert kinds == ["DiskFull"]


class Slow(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    """Holds every call until `release` is set: RPCs stay in flight."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def GetProgress(self, request, context):  # type: ignore[no-untyped-def]
        self.entered += 1
        await self.release.wait()
        return orchestrator_pb2.Progress(state="done")


async def test_concurrency_limit_refuses_extra_rpcs_but_health_still_answers() -> None:
    slow = Slow()
    binding = ServiceBinding(
        slow,
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server,
        "tidal.rpc.v1.OrchestratorService",
    )
    config = GrpcConfig(shutdown_grace_s=0.2, max_concurrent_rpcs=3)
    server = GrpcServer("127.0.0.1:0", [binding], config, security=PLAINTEXT_LOOPBACK)
    await server.start()
    try:
        async with make_channel(f"127.0.0.1:{server.port}", security=PLAINTEXT_LOOPBACK) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            request = common_pb2.StatusRequest()
            held = [asyncio.ensure_future(stub.GetProgress(request)) for _ in range(3)]
            while slow.entered < 3:
                await asyncio.sleep(0.02)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetProgress(common_pb2.StatusRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "grpc.max_concurrent_rpcs" in (err.value.details() or "")
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            slow.release.set()
            assert [r.state for r in await asyncio.gather(*held)] == ["done"] * 3
    finally:
        await server.stop()


async def test_request_over_the_rpc_limit_is_refused_unparsed(server: GrpcServer) -> None:
    """A message over `grpc.max_request_bytes` is refused RESOURCE_EXHAUSTED by gRPC from
    its length prefix; the server answers the next call."""
    async with make_channel(f"127.0.0.1:{server.port}", security=PLAINTEXT_LOOPBACK) as channel:
        call = channel.unary_unary(
            "/tidal.rpc.v1.OrchestratorService/GetProgress",
            request_serializer=lambda raw: raw,
            response_deserializer=orchestrator_pb2.Progress.FromString,
        )
        big = b"\x0a\x80\x80\x80\x04" + b"x" * (8 << 20)  # field 1, 8 MiB of bytes
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(big, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await _call(server, **{"x-request-id": "after"})).state == "after"


async def test_single_request_rpc_without_its_message_is_invalid(server: GrpcServer) -> None:
    """A unary RPC is read as a stream of one message (after the gates that run first):
    a call that half-closes without one is INVALID_ARGUMENT naming the request."""
    async with make_channel(f"127.0.0.1:{server.port}", security=PLAINTEXT_LOOPBACK) as channel:
        call = channel.stream_unary(
            "/tidal.rpc.v1.OrchestratorService/GetProgress",
            response_deserializer=orchestrator_pb2.Progress.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(iter([]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("request:"), err.value.details()
    assert (await _call(server, **{"x-request-id": "after"})).state == "after"


async def test_request_id_comes_from_metadata_or_is_made(server: GrpcServer) -> None:
    assert (await _call(server, **{"x-request-id": "abc123"})).state == "abc123"
    made = (await _call(server)).state
    assert len(made) == 12 and made != "-"


async def test_request_stop_reports_not_serving_then_stops(server: GrpcServer) -> None:
    async with make_channel(f"127.0.0.1:{server.port}", security=PLAINTEXT_LOOPBACK) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        serving = asyncio.create_task(server.serve_forever())
        server.request_stop()
        second = await asyncio.wait_for(watch.read(), timeout=5)
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await asyncio.wait_for(serving, timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with make_channel(f"127.0.0.1:{server.port}", security=PLAINTEXT_LOOPBACK) as channel:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1, wait_for_ready=False
            )
    # gone: UNAVAILABLE, or the deadline while the channel's retry policy kept trying
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_a_second_server_cannot_bind_a_served_address(server: GrpcServer) -> None:
    """No SO_REUSEPORT: a second server (any process of this user) on a served port fails
    at bind instead of quietly taking part of the first one's connections."""
    binding = ServiceBinding(
        Raising(),
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server,
        "tidal.rpc.v1.OrchestratorService",
    )
    with pytest.raises((OSError, RuntimeError), match="bind"):
        GrpcServer(f"127.0.0.1:{server.port}", [binding], GrpcConfig(), security=PLAINTEXT_LOOPBACK)
    assert (await _call(server, **{"x-request-id": "still"})).state == "still"
