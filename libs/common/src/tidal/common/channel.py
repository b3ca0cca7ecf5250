"""gRPC channel helper: every client channel has the same limits, retries and tracing.

- message size limits matching the servers (`grpc.max_message_bytes`);
- keepalive pings, so a dead peer is noticed on long-lived streams (Watch);
- wait-for-ready, so callers started before their server simply wait (bounded by the
  call's deadline) instead of failing fast during start-up;
- retries of UNAVAILABLE by gRPC's own retry policy (service config), not hand loops;
- request-id and OpenTelemetry client interceptors (trace context in metadata).
"""

from __future__ import annotations

import json

import grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from tidal.common.interceptors import RequestIdClientInterceptor
from tidal.common.sections import GrpcConfig
from tidal.common.server import message_options

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


def make_channel(address: str, config: GrpcConfig | None = None) -> grpc.aio.Channel:
    config = config or GrpcConfig()
    options = [
        *message_options(config),
        ("grpc.keepalive_time_ms", int(config.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _SERVICE_CONFIG),
    ]
    interceptors = [RequestIdClientInterceptor(), *aio_client_interceptors()]
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
