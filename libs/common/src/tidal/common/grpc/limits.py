"""Transport limits of every server: request size per RPC, RPCs in flight.

gRPC takes one receive limit per server, so a server hosting a bulk RPC (`BULK_METHODS`)
receives up to `grpc.max_message_bytes` and every other method's deserializer refuses a
request over `grpc.max_request_bytes` unparsed. RPCs in flight beyond
`grpc.max_concurrent_rpcs` are refused, probes not counted (docs/operations.md, "Limits").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import ResourceExhausted

BULK_METHODS = frozenset(
    {
        "/tidal.rpc.v1.TrainerService/Train",
        "/tidal.rpc.v1.WeightSyncService/UploadWeights",
    }
)
"""Full method names whose requests carry bulk data (up to `grpc.max_message_bytes`)."""

UNCOUNTED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Methods never refused for concurrency: probes must answer under load."""

PROBE_HEADROOM = 64
"""RPCs above `max_concurrent_rpcs` grpc itself admits, for health checks and reflection."""


def request_limit(method: str, config: GrpcConfig) -> int:
    """Largest request message (bytes) the full method name `method` accepts."""
    return config.max_message_bytes if method in BULK_METHODS else config.max_request_bytes


def server_options(config: GrpcConfig, services: Sequence[str]) -> list[tuple[str, int]]:
    """Size options of a server hosting the full service names `services`."""
    bulk = any(m.split("/")[1] in services for m in BULK_METHODS)
    receive = config.max_message_bytes if bulk else config.max_request_bytes
    return [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", max(receive, config.max_request_bytes)),
    ]


@dataclass(frozen=True)
class Oversize:
    """What a sized deserializer hands the handler instead of a too-large request: returned,
    not raised, because grpc answers an exception inside deserialization INTERNAL with no
    message of ours."""

    size: int
    limit: int

    def error(self) -> ResourceExhausted:
        return ResourceExhausted(
            f"request: {self.size} bytes exceed this RPC's limit of {self.limit} bytes "
            "(grpc.max_request_bytes; bulk RPCs: grpc.max_message_bytes)"
        )


def sized_deserializer(
    deserialize: Callable[[bytes], Any] | None, limit: int
) -> Callable[[bytes], Any]:
    """`deserialize`, refusing (with an `Oversize` marker) a message over `limit` bytes."""

    def checked(raw: bytes) -> Any:
        if len(raw) > limit:
            return Oversize(len(raw), limit)
        return raw if deserialize is None else deserialize(raw)

    return checked


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
