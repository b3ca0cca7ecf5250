"""Transport limits every Tidal server applies: request size per RPC, RPCs in flight.

Decisions:
- Sizes per RPC, not one limit for everything. gRPC servers take one receive limit
  (`grpc.max_receive_message_length`) per server, and grpc's per-method limits
  (service config `maxRequestMessageBytes`) apply on the client only. So two layers:
  1. transport: each server's receive limit is `grpc.max_request_bytes` (4 MiB) unless
     it hosts a bulk RPC (`BULK_METHODS`: Train carries micro-batches, UploadWeights
     weight chunks), then `grpc.max_message_bytes` (256 MiB). gRPC refuses a larger
     message from its length prefix with RESOURCE_EXHAUSTED before buffering it, so a
     100 MB prompt never reaches inference's Python code;
  2. per method, on a server that hosts both kinds: the error-mapping interceptor wraps
     each method's request deserializer (`sized_deserializer`), which sees the raw bytes
     first. A control RPC (GetStatus, Publish, Watch...) over `max_request_bytes` is
     refused RESOURCE_EXHAUSTED without being parsed. The deserializer returns an
     `Oversize` marker instead of raising, because an exception inside grpc's
     deserialization is answered INTERNAL with no message we control.
- Concurrency: the interceptor counts the RPCs in flight (`RpcSlots`) and answers
  RESOURCE_EXHAUSTED ("grpc.max_concurrent_rpcs") beyond `grpc.max_concurrent_rpcs`.
  Health and reflection are not counted, so a saturated server still answers its
  probes; grpc's own `maximum_concurrent_rpcs` is set to the limit plus
  `PROBE_HEADROOM` as the hard backstop that also bounds the probes.
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
    """What a sized deserializer hands the handler instead of a too-large request."""

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
