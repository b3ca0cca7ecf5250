"""Client channels, every one with the same limits, retries, tracing and transport security.

Services wait for their peers (wait-for-ready, UNAVAILABLE retried by gRPC's own policy, a
short reconnect back-off), since at start-up a peer still importing torch is normal. A
person's tool instead `connect`s first and gets `Unreachable` at once for a service that
is down (docs/architecture.md, "Errors and shutdown").
"""

from __future__ import annotations

import asyncio
import json

from opentelemetry.instrumentation.grpc import aio_client_interceptors

import grpc
from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import Unreachable
from tidal.common.grpc.interceptors import RequestIdClientInterceptor
from tidal.common.grpc.server import message_options
from tidal.common.security.transport import TransportSecurity

_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{}],
                "waitForReady": True,
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "5s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


RECONNECT_BACKOFF_MS = {"initial": 100, "max": 500}
CONNECT_TIMEOUT_S = 2.0
_FAILED = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)


def make_channel(
    address: str, config: GrpcConfig | None = None, *, security: TransportSecurity
) -> grpc.aio.Channel:
    security.check_address(address, "dial")
    config = config or GrpcConfig()
    options = [
        *message_options(config),
        ("grpc.keepalive_time_ms", int(config.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _SERVICE_CONFIG),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["initial"]),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["max"]),
    ]
    interceptors = [RequestIdClientInterceptor(), *aio_client_interceptors()]
    credentials = security.channel_credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


async def wait_connected(
    channel: grpc.aio.Channel,
    *,
    service: str,
    address: str,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> None:
    """Bring `channel` to READY, or raise `Unreachable` naming `service` and `address`
    when the connection fails or nothing answers within `timeout_s`."""

    async def ready() -> None:
        state = channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state in _FAILED:
                raise Unreachable(service, address, "connection failed")
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)

    try:
        await asyncio.wait_for(ready(), timeout_s)
    except TimeoutError:
        raise Unreachable(service, address, f"nothing answered within {timeout_s:g}s") from None


async def connect(
    service: str,
    address: str,
    config: GrpcConfig | None = None,
    *,
    security: TransportSecurity,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> grpc.aio.Channel:
    """A `make_channel` channel that is already connected; raises `Unreachable` (and
    closes the channel) when `service` at `address` cannot be reached in `timeout_s`."""
    channel = make_channel(address, config, security=security)
    try:
        await wait_connected(channel, service=service, address=address, timeout_s=timeout_s)
    except Unreachable:
        await channel.close()
        raise
    return channel
