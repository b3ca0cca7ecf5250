"""Transport limits of every server: the size of a received message, RPCs in flight.

Every server receives messages of at most `grpc.max_request_bytes`, whatever it hosts:
gRPC refuses a larger one from its length prefix, before it is buffered or any handler
(or the open health service) runs. Bulk data (a step, a weight file) crosses as a
stream of chunks each under that limit (`max_chunk_bytes`). RPCs in flight beyond
`grpc.max_concurrent_rpcs` are refused, probes not counted (docs/operations.md, "Limits").
"""

from __future__ import annotations

from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import ResourceExhausted

UNCOUNTED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Methods never refused for concurrency: probes must answer under load."""

PROBE_HEADROOM = 64
"""RPCs above `max_concurrent_rpcs` grpc itself admits, for health checks and reflection."""

CHUNK_ENVELOPE_BYTES = 64 * 1024
"""Room a chunk message keeps under `grpc.max_request_bytes` for its fields other than the
data (a weight file's path, offsets, the stream's framing)."""


def max_chunk_bytes(config: GrpcConfig) -> int:
    """Most data bytes one chunk of a TrainStream or UploadWeights stream may carry."""
    return config.max_request_bytes - CHUNK_ENVELOPE_BYTES


def check_chunk_size(field: str, size: int, config: GrpcConfig) -> None:
    """ResourceExhausted naming `field` when a chunk carries more than `max_chunk_bytes`."""
    limit = max_chunk_bytes(config)
    if size > limit:
        raise ResourceExhausted(
            f"{field}: a chunk of {size} bytes, more than the {limit} one chunk may carry "
            "(grpc.max_request_bytes less 64 KiB); send smaller chunks"
        )


def server_options(config: GrpcConfig) -> list[tuple[str, int]]:
    """Size options of every server: it receives `max_request_bytes`, sends
    `max_message_bytes`."""
    return [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_request_bytes),
    ]


class RpcSlots:
    """Counts RPCs in flight; `acquire` raises ResourceExhausted beyond the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def acquire(self) -> None:
        if self.in_flight >= self.limit:
            raise ResourceExhausted(
                f"server busy: {self.in_flight} RPCs in flight, the limit is {self.limit} "
                "(grpc.max_concurrent_rpcs); retry later"
            )
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1


def counted(method: str) -> bool:
    """Whether the full method name counts against `max_concurrent_rpcs`."""
    return not method.startswith(UNCOUNTED_PREFIXES)
