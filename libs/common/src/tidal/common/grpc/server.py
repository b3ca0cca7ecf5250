"""One way to build, run and stop every Tidal server.

Each gets the transport limits, the standard health service (with a real Watch), the
error-mapping, tracing and authorization interceptors, its `TransportSecurity`'s
credentials, reflection only when enabled, its `/metrics` endpoint when given one, and
graceful shutdown: SIGTERM → health NOT_SERVING → `server.stop(grace)` → the close hook.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

import grpc
from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.interceptors import ErrorMappingInterceptor
from tidal.common.grpc.limits import PROBE_HEADROOM, server_options
from tidal.common.observability.prometheus import ServiceMetrics, TlsMaterial
from tidal.common.security.authz import AuthorizationInterceptor
from tidal.common.security.config import host_of
from tidal.common.security.transport import TransportSecurity

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class ServiceBinding:
    """A servicer with its generated `add_*_to_server` function and full service name."""

    servicer: Any
    register: Callable[[Any, grpc.aio.Server], None]
    full_name: str


def message_options(config: GrpcConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
    ]


def tls_material(security: TransportSecurity) -> TlsMaterial:
    """What the metrics endpoint serves HTTPS with: this process's gRPC credentials."""
    return TlsMaterial(
        security.mode,
        security.cert_pem,
        security.key_pem,
        security.ca_pem,
        frozenset(security.verifiers.values()),
    )


class GrpcServer:
    """A started grpc.aio server with health (and reflection if enabled). Use
    `serve_forever()`. `security` is required: `TransportSecurity.from_config(...)` in
    services, `PLAINTEXT_LOOPBACK` in in-process tests."""

    def __init__(
        self,
        address: str,
        bindings: Sequence[ServiceBinding],
        config: GrpcConfig,
        *,
        security: TransportSecurity,
        metrics: ServiceMetrics | None = None,
    ):
        security.check_address(address, "listen on")
        self.security = security
        self.address = address
        self.metrics = metrics
        self.config = config
        self.bindings = list(bindings)
        self.health = health.aio.HealthServicer()
        names = [b.full_name for b in self.bindings]
        options = [
            *server_options(config),  # the receive limit (tidal.common.grpc.limits)
            # Accept the clients' keepalive pings (tidal.common.grpc.channel sends them).
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
            ("grpc.http2.max_ping_strikes", 0),
            # One server per address: gRPC binds with SO_REUSEPORT by default on Linux, so a
            # second process on the same port would quietly take half the connections.
            ("grpc.so_reuseport", 0),
        ]
        # Health checks are not traced: they are noise in every trace, and the OTel aio
        # interceptor only handles async-generator streams, not grpc_health's Watch,
        # which writes with `context.write`.
        tracing = aio_server_interceptor(filter_=filters.negate(filters.health_check()))
        interceptors: list[grpc.aio.ServerInterceptor] = [
            tracing,
            ErrorMappingInterceptor(config),
        ]
        if security.mode != "plaintext":  # plaintext authenticates nobody: nothing to check
            interceptors.insert(0, AuthorizationInterceptor(security))
        self.server = grpc.aio.server(
            interceptors=interceptors,
            options=options,
            maximum_concurrent_rpcs=config.max_concurrent_rpcs + PROBE_HEADROOM,
        )
        for binding in self.bindings:
            binding.register(binding.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if security.reflection:
            reflection.enable_server_reflection(
                [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
            )
        credentials = security.server_credentials()
        if credentials is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, credentials)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {address}")
        self._stopping = asyncio.Event()
        self._shutdown_hooks: list[Callable[[], None]] = []

    def add_shutdown_hook(self, hook: Callable[[], None]) -> None:
        """`hook` runs when the graceful shutdown begins, before the grace period: it ends
        streams that would otherwise run until the grace ran out (a watch stream)."""
        self._shutdown_hooks.append(hook)

    async def start(self, *, serving: bool = True) -> None:
        await self.server.start()
        if self.metrics is not None:
            configured_port = int(self.address.rsplit(":", 1)[1])
            self.metrics.start(host_of(self.address), configured_port, tls_material(self.security))
        await self.set_serving(serving)

    async def set_serving(self, serving: bool) -> None:
        """Overall ("") and per-service health status."""
        status = SERVING if serving else NOT_SERVING
        for name in ("", *(b.full_name for b in self.bindings)):
            await self.health.set(name, status)

    def request_stop(self) -> None:
        self._stopping.set()

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        for hook in self._shutdown_hooks:
            hook()
        await self.server.stop(self.config.shutdown_grace_s)
        if self.metrics is not None:
            self.metrics.stop()

    async def serve_forever(
        self,
        *,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        on_signal: Callable[[], None] | None = None,
    ) -> None:
        """Run until SIGTERM/SIGINT or `request_stop()`, then shut down gracefully.
        `on_signal` runs at once when the signal arrives, before the grace period (the
        trainer uses it to abandon a running step at its next micro-batch)."""
        loop = asyncio.get_running_loop()

        def stopping() -> None:
            if on_signal is not None:
                on_signal()
            self._stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping)
        await self._stopping.wait()
        log.info("shutting down (grace %.1fs)", self.config.shutdown_grace_s)
        await self.stop()
        if on_stop is not None:
            await on_stop()
