"""Domain errors shared by every service.

Domain code raises these; one server interceptor (`tidal.common.grpc.interceptors`) maps them
to gRPC status codes, so servicers never build status objects by hand. Each class carries
the status code it maps to. `InvalidArgument` names the offending request field, because
an INVALID_ARGUMENT message must tell the caller which field to fix.
"""

from __future__ import annotations

import grpc


class TidalError(Exception):
    """Base of all domain errors; maps to INTERNAL unless a subclass says otherwise."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(TidalError):
    """A request field has a value the service cannot accept."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class FailedPrecondition(TidalError):
    """The request is well formed but the service is in the wrong state for it."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class NotFound(TidalError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(TidalError):
    """A limit (queue length, memory) is reached; the caller may retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(TidalError):
    """A transient fault: the service cannot answer now (e.g. no weights loaded yet)."""

    code = grpc.StatusCode.UNAVAILABLE


class Unreachable(Unavailable):
    """Nothing answers at a service's address: the message names the service and address."""

    def __init__(self, service: str, address: str, reason: str) -> None:
        self.service = service
        self.address = address
        super().__init__(f"cannot reach {service} at {address} ({reason})")


class ConfigError(Exception):
    """A configuration problem found before anything starts. Not a gRPC error."""
