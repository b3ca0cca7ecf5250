"""Weightsync's protobuf messages ⇄ the library's domain types (servicer and client).

One conversion both ends share, so a manifest is validated the same way wherever it is
read: a malformed one is `InvalidArgument` naming the field (`manifest.files[0].sha256`).
`BroadcastSeat` and the `BroadcastGroup` message share their field names.
"""

from __future__ import annotations

from dataclasses import asdict, fields

from tidal.common.errors import InvalidArgument
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.weights.manifest import (
    FORMATS,
    LORA_ADAPTERS,
    LoadedVersions,
    VersionEvent,
    WeightFile,
    WeightManifest,
)
from tidal.weights.transport_choice import BroadcastSeat, TransportChoice


def manifest_to_proto(m: WeightManifest) -> pb.WeightManifest:
    return pb.WeightManifest(
        version=m.version,
        step=m.step,
        format=m.format,
        location=m.location,
        files=[pb.WeightFile(path=f.path, size=f.size, sha256=f.sha256) for f in m.files],
        base_version=m.base_version or 0,
    )


def manifest_from_proto(m: pb.WeightManifest, *, field: str = "manifest") -> WeightManifest:
    if m.version < 0:
        raise InvalidArgument(f"{field}.version", f"must be >= 0, got {m.version}")
    if m.step < 0:
        raise InvalidArgument(f"{field}.step", f"must be >= 0, got {m.step}")
    if m.format not in FORMATS:
        raise InvalidArgument(
            f"{field}.format", f"unsupported {m.format!r}; supported: {', '.join(FORMATS)}"
        )
    base_version = _base_version(m, field)
    if not m.location:
        raise InvalidArgument(f"{field}.location", "must name the folder holding the files")
    if not m.files:
        raise InvalidArgument(f"{field}.files", "must list at least one file")
    for i, f in enumerate(m.files):
        if not f.path or f.path.startswith("/") or ".." in f.path.split("/"):
            raise InvalidArgument(
                f"{field}.files[{i}].path", f"must be a relative path, got {f.path!r}"
            )
        if len(f.sha256) != 64:
            raise InvalidArgument(f"{field}.files[{i}].sha256", "must be 64 hex characters")
    files = tuple(WeightFile(f.path, f.size, f.sha256) for f in m.files)
    return WeightManifest(m.version, m.step, m.location, files, m.format, base_version)


def _base_version(m: pb.WeightManifest, field: str) -> int | None:
    """Adapters name an older version as their base; full weights have none."""
    if m.format != LORA_ADAPTERS:
        return None
    if not 0 <= m.base_version < m.version:
        raise InvalidArgument(
            f"{field}.base_version",
            f"adapters of version {m.version} must apply to an older version, got {m.base_version}",
        )
    return m.base_version


def event_to_proto(e: VersionEvent) -> pb.WeightVersion:
    return pb.WeightVersion(
        manifest=manifest_to_proto(e.manifest),
        loaded_by=list(e.loaded_by),
        published_unix_ms=e.published_unix_ms,
        trace_context=e.trace_context,
    )


def event_from_proto(v: pb.WeightVersion) -> VersionEvent:
    return VersionEvent(
        manifest=manifest_from_proto(v.manifest),
        trace_context=dict(v.trace_context),
        loaded_by=tuple(v.loaded_by),
        published_unix_ms=v.published_unix_ms,
    )


def loaded_versions_to_proto(v: LoadedVersions) -> pb.LoadedVersions:
    return pb.LoadedVersions(published=v.published, replicas=v.replicas)


def loaded_versions_from_proto(v: pb.LoadedVersions) -> LoadedVersions:
    return LoadedVersions(v.published, dict(v.replicas))


def transport_choice_to_proto(p: TransportChoice) -> pb.SyncPlan:
    group = pb.BroadcastGroup(**asdict(p.seat)) if p.seat is not None else None
    return pb.SyncPlan(transport=p.transport, chunk_bytes=p.chunk_bytes, group=group)


def transport_choice_from_proto(p: pb.SyncPlan) -> TransportChoice:
    seat = None
    if p.HasField("group"):
        seat = BroadcastSeat(**{f.name: getattr(p.group, f.name) for f in fields(BroadcastSeat)})
    return TransportChoice(p.transport, p.chunk_bytes, seat)


ROLES = {pb.SYNC_ROLE_TRAINER: "trainer", pb.SYNC_ROLE_REPLICA: "replica"}


def role_from_proto(role: int) -> str:
    if role not in ROLES:
        raise InvalidArgument("role", f"must be SYNC_ROLE_TRAINER or SYNC_ROLE_REPLICA, got {role}")
    return ROLES[role]


def role_to_proto(role: str) -> int:
    return {v: k for k, v in ROLES.items()}[role]
