"""Domain errors shared by every service.

Domain code raises these; one server interceptor (`tidal.common.grpc.interceptors`) maps them
to gRPC status codes, so servicers never build status objects by hand. Each class carries
the status code it maps to. `InvalidArgument` names the offending request field, because
an INVALID_ARGUMENT message must tell the caller which field to fix.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

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


EXIT_DISK_FULL = 74
"""A service's exit code (sysexits' EX_IOERR) when a full disk stopped the run: `tidal rl`
does not restart it (a restart would fail the same way) and ends the run, naming
`--resume`."""


def is_disk_full(error: BaseException) -> bool:
    """True for a `DiskFull`, raised here or reported by a peer (its `kind`)."""
    return isinstance(error, DiskFull) or getattr(error, "kind", None) == DiskFull.__name__


class DiskFull(ResourceExhausted):
    """A write failed for want of space (ENOSPC, EDQUOT): a retry fails the same way until
    someone frees space, so callers stop rather than retry. Names the path and the space."""

    def __init__(self, path: Path, needed_bytes: int | None) -> None:
        self.path = path
        self.needed_bytes = needed_bytes
        need = f"at least {_mib(needed_bytes)} needed, " if needed_bytes is not None else ""
        super().__init__(
            f"disk full: {path} could not be written ({need}{_mib(free_bytes(path))} free "
            "on its filesystem)"
        )

    @classmethod
    def reported(cls, peer: str, message: str) -> DiskFull:
        """A `DiskFull` a peer answered (its status `message`), raised again here so this
        service stops as it would for its own; the path and space are the peer's."""
        error = cls.__new__(cls)
        error.path, error.needed_bytes = Path(peer), None
        Exception.__init__(error, f"{peer}: {message}")
        return error


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    for folder in (path, *path.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(folder).free
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


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
