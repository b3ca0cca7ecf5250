"""Configuration of the weight-sync service (`[weightsync]`).

The data path is a discriminated union on `transport.type`, so each path carries only
its own settings and an unknown type is a clear error naming the valid ones. Trainer and
inference do not read this section: they ask the running service (`JoinSync`), so the
service's config is the single place the run's data path is chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig
from tidal.common.config.schema import FIRST
from tidal.common.config.shared import ServiceRunConfig
from tidal.common.grpc.limits import max_chunk_bytes


class FilesystemTransport(BaseConfig):
    """Shared folder: safetensors + manifest, written to a temp folder and renamed atomically."""

    type: Literal["filesystem"] = "filesystem"
    """Data path: trainer and replicas see the same folder (weightsync's root)."""


class BroadcastTransport(BaseConfig):
    """torch.distributed broadcast from trainer rank 0 to every replica, in fixed-size buckets.

    Every version is also written to the shared folder, which is how a replica that
    joins late (or misses a broadcast) catches up.
    """

    type: Literal["broadcast"] = "broadcast"
    """Data path: a process group between trainer rank 0 and the replicas."""
    replicas: int = Field(default=1, ge=1)
    """Replicas in the group (world size - 1); more replicas use the filesystem path."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend; "auto" is NCCL when the trainer has CUDA, else gloo."""
    bucket_bytes: int = Field(default=64 << 20, gt=0)
    """Bytes per broadcast: neither side holds more than one bucket beyond the weights."""
    timeout_s: float = Field(default=300.0, gt=0)
    """How long group formation and each collective may take before a member gives up."""
    reform_window_s: float = Field(default=5.0, gt=0)
    """When the trainer re-forms a broken group (or restarts), the replicas that rejoin
    within this many seconds make up the new group (the first group waits for all)."""


class StreamTransport(BaseConfig):
    """Chunked gRPC transfer through this service, for hosts without a shared filesystem."""

    type: Literal["stream"] = "stream"
    """Data path: the trainer uploads the files, replicas fetch them (resumable by offset)."""
    max_upload_bytes: int = Field(default=256 << 30, gt=0)
    """Largest version an upload may carry: the sum of its manifest's file sizes. A larger
    manifest is refused RESOURCE_EXHAUSTED naming `manifest.files` before a byte is
    written, so no caller (not even one holding the trainer's identity) can fill the disk
    past it. Raise it for models whose weights are larger."""


Transport = Annotated[
    FilesystemTransport | BroadcastTransport | StreamTransport, Field(discriminator="type")
]


class WeightSyncConfig(BaseConfig):
    transport: Annotated[Transport, FIRST] = FilesystemTransport()
    """Data path of published weights: filesystem | broadcast | stream (`transport.type`)."""
    root: Path | None = None
    """Folder holding version folders; default `<run dir>/weights`."""
    keep_last: int = Field(default=3, ge=1)
    """Versions kept on disk; older ones are deleted unless a replica still serves them."""
    chunk_bytes: int = Field(default=2 << 20, gt=0)
    """Chunk size of UploadWeights and FetchWeights streams; at most
    `grpc.max_request_bytes` less 64 KiB, so an upload chunk fits the servers' receive
    limit."""
    lease_s: float = Field(default=30.0, gt=0)
    """Seconds a replica's registration outlives its Watch stream: a replica that stops
    watching (killed, or restarted under a new id) and does not call in for this long
    stops pinning the version it served (or was loading) on disk."""


class WeightSyncRunConfig(ServiceRunConfig):
    weightsync: WeightSyncConfig = WeightSyncConfig()  # type: ignore[assignment]

    @model_validator(mode="after")
    def _chunks_fit(self) -> WeightSyncRunConfig:
        limit = max_chunk_bytes(self.grpc)
        if self.weightsync.chunk_bytes > limit:
            raise ValueError(
                f"weightsync.chunk_bytes ({self.weightsync.chunk_bytes}) is more than a chunk "
                f"may carry, {limit} (grpc.max_request_bytes less 64 KiB): lower it or raise "
                "grpc.max_request_bytes"
            )
        return self

    @property
    def weights_root(self) -> Path:
        return self.weightsync.root or self.run.dir / "weights"
