"""The version registry: which versions exist, which replica serves which, who is waiting.

Versions only grow and register only after their files verify. Retention keeps the newest
`keep_last`, every version a live replica serves or is loading (leases.py) and the bases of
kept adapters, deleting only inside the root. Every change (a publish, an acknowledgement,
a replica registering or expiring) bumps one revision that the Watch and WatchLoaded
streams wait on. A restart rebuilds it from disk (recovery.py), and Publish is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tidal.common.errors import FailedPrecondition, InvalidArgument, NotFound
from tidal.common.files.safe_remove import remove_inside
from tidal.weights.folder import version_dir
from tidal.weights.manifest import (
    CONFIG_FILE,
    FULL_WEIGHTS,
    WEIGHTS_FILE,
    LoadedVersions,
    VersionEvent,
    WeightManifest,
    verify_files,
)
from tidal.weightsync.leases import Leases
from tidal.weightsync.recovery import recover_versions

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE)
"""Files every version's manifest lists, full weights and LoRA adapters alike."""


@dataclass
class _Entry:
    event: VersionEvent
    loaded_by: set[str] = field(default_factory=set)

    def snapshot(self) -> VersionEvent:
        return replace(self.event, loaded_by=tuple(sorted(self.loaded_by)))


class VersionRegistry:
    def __init__(self, root: Path, keep_last: int, *, leases: Leases | None = None) -> None:
        self.root = root
        self.keep_last = keep_last
        self.leases = leases or Leases(DEFAULT_LEASE_S)
        self._entries: dict[int, _Entry] = {}
        self._replicas: dict[str, int] = {}  # replica id → version it serves (-1: none yet)
        self._loading: dict[str, int] = {}  # replica id → version it is loading
        self._revision = 0  # counts changes subscribers see (publishes, loads, replicas)
        self._changed = asyncio.Event()  # set and replaced at every change
        self.recycle: Callable[[Path], None] | None = None
        """Called with a retired version's folder before it is removed (the stream path
        keeps its weights file to write the next upload over)."""
        self._load_existing()

    def _load_existing(self) -> None:
        for manifest in recover_versions(self.root, REQUIRED_FILES):
            self._entries[manifest.version] = _Entry(VersionEvent(manifest))

    @property
    def newest(self) -> int:
        return max(self._entries, default=-1)

    def get(self, version: int) -> VersionEvent:
        """One version, or the newest when version < 0."""
        if version < 0:
            if not self._entries:
                raise NotFound("no version has been published yet")
            version = self.newest
        entry = self._entries.get(version)
        if entry is None:
            raise NotFound(f"version {version} is not registered (known: {sorted(self._entries)})")
        return entry.snapshot()

    def all(self) -> list[VersionEvent]:
        return [self._entries[v].snapshot() for v in sorted(self._entries)]

    def check_newer(self, version: int) -> None:
        """Raise FailedPrecondition unless `version` is newer than every published one."""
        if version <= self.newest:
            raise FailedPrecondition(
                f"manifest.version {version} is not greater than the newest "
                f"published version {self.newest}"
            )

    async def publish(
        self, manifest: WeightManifest, trace_context: dict[str, str], *, verified: bool = False
    ) -> None:
        """Register a version whose files are in place; `verified` skips re-hashing files
        the caller just hashed while writing them (uploads)."""
        check_required_files(manifest)
        if self.already_registered(manifest):
            return
        self.check_newer(manifest.version)
        self.check_base(manifest)
        if not verified:
            # Hashing reads every byte: keep it off the event loop.
            await asyncio.to_thread(verify_files, manifest)
        if self.already_registered(manifest):  # the same publish, retried concurrently
            return
        if manifest.version <= self.newest:  # a concurrent publish won meanwhile
            raise FailedPrecondition(
                f"manifest.version {manifest.version} lost a race to version {self.newest}"
            )
        event = VersionEvent(manifest, trace_context, (), int(time.time() * 1000))
        self._entries[manifest.version] = _Entry(event)
        self._retain()
        self._bump()

    def already_registered(self, manifest: WeightManifest) -> bool:
        """True when this exact version is registered already (a retried publish).

        The same version with other content is not: `check_newer` refuses it."""
        entry = self._entries.get(manifest.version)
        if entry is None:
            return False
        held = entry.event.manifest
        same = (
            set(held.files) == set(manifest.files)
            and held.format == manifest.format
            and held.base_version == manifest.base_version
            and held.step == manifest.step
        )
        if same:
            log.info("version %d is registered already; publish answered again", held.version)
        return same

    def check_location(self, location: Path, version: int) -> None:
        """A published folder must be exactly the registry's `<root>/v<version>`, so
        retention can only ever delete a version's own folder."""
        expected = version_dir(self.root, version)
        if location.resolve() != expected.resolve():
            raise InvalidArgument(
                "manifest.location",
                f"must be {expected} (the folder of version {version} under the weights "
                f"root), got {location}",
            )

    def check_base(self, manifest: WeightManifest) -> None:
        """LoRA adapters must name a registered full-weights version as their base."""
        if manifest.base_version is None:
            return
        base = self._entries.get(manifest.base_version)
        if base is None or base.event.manifest.format != FULL_WEIGHTS:
            held = "is not registered" if base is None else "holds adapters, not full weights"
            raise FailedPrecondition(
                f"manifest.base_version {manifest.base_version} {held}: adapters of version "
                f"{manifest.version} need full base weights"
            )

    def register_replica(self, replica_id: str) -> None:
        if not replica_id:
            raise InvalidArgument("replica_id", "must not be empty")
        if replica_id not in self._replicas:
            self._replicas[replica_id] = -1
            self._bump()
        self.leases.renew(replica_id)

    def watch_opened(self, replica_id: str, loaded_version: int | None = None) -> None:
        """A Watch stream of `replica_id` is open: its lease holds until it closes.
        `loaded_version`, the version it says it serves, counts as acknowledged when it
        is registered (a restarted registry learns it again this way)."""
        self.register_replica(replica_id)
        self.leases.stream_opened(replica_id)
        if loaded_version is not None and loaded_version in self._entries:
            self._loaded(replica_id, loaded_version)

    def watch_closed(self, replica_id: str) -> None:
        """Its stream is gone; the lease now runs out after `lease_s` unless renewed."""
        self.leases.stream_closed(replica_id)

    def _known(self, replica_id: str) -> None:
        if replica_id not in self._replicas:
            raise FailedPrecondition(
                f"unknown replica_id {replica_id!r}: a replica registers by calling Watch "
                "first (or its lease expired: it stopped watching for longer than lease_s)"
            )
        self.leases.renew(replica_id)

    def _expire_leases(self) -> None:
        for replica_id in self.leases.expired(list(self._replicas)):
            log.info(
                "replica %s stopped renewing its lease; it no longer pins version %d",
                replica_id,
                max(self._replicas[replica_id], self._loading.get(replica_id, -1)),
            )
            self._replicas.pop(replica_id, None)
            self._loading.pop(replica_id, None)
            self._bump()

    @property
    def replicas(self) -> dict[str, int]:
        """Replica id → newest version it acknowledged (-1: none yet), live leases only."""
        return dict(self._replicas)

    def begin_load(self, replica_id: str, version: int) -> None:
        """Keep `version`'s files while the replica loads it; NotFound if already removed."""
        self._known(replica_id)
        if version not in self._entries:
            raise NotFound(
                f"version {version} is not registered (removed by retention or never "
                f"published; newest is {self.newest})"
            )
        self._loading[replica_id] = version

    def ack(self, replica_id: str, version: int) -> None:
        self._known(replica_id)
        if version not in self._entries:
            raise InvalidArgument("version", f"version {version} is not registered")
        self._loaded(replica_id, version)

    def _loaded(self, replica_id: str, version: int) -> None:
        self._entries[version].loaded_by.add(replica_id)
        self._replicas[replica_id] = max(self._replicas[replica_id], version)
        if self._loading.get(replica_id, -1) <= version:
            self._loading.pop(replica_id, None)
        self._bump()

    def loaded_versions(self) -> LoadedVersions:
        """The newest published version and the version each known replica serves."""
        return LoadedVersions(self.newest, dict(self._replicas))

    def _bump(self) -> None:
        self._revision += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_changed(self, after_revision: int) -> int:
        """Wait until something changed after `after_revision`; returns the new revision
        (0 is before any change: a first call with -1 returns at once)."""
        while self._revision <= after_revision:
            await self._changed.wait()
        return self._revision

    async def wait_newer(self, after: int) -> list[VersionEvent]:
        """Versions newer than `after`, waiting until there is at least one."""
        revision = -1
        while self.newest <= after:
            revision = await self.wait_changed(revision)
        return [self._entries[v].snapshot() for v in sorted(self._entries) if v > after]

    def _retain(self) -> None:
        self._expire_leases()
        keep = set(sorted(self._entries)[-self.keep_last :]) | set(self._replicas.values())
        keep |= set(self._loading.values())
        bases = (self._entries[v].event.manifest.base_version for v in keep & set(self._entries))
        keep |= {base for base in bases if base is not None}
        for version in sorted(set(self._entries) - keep):
            folder = Path(self._entries.pop(version).event.manifest.location)
            if self.recycle is not None and folder.parent.resolve() == self.root.resolve():
                self.recycle(folder)
            remove_inside(folder, self.root, ignore_errors=True)
            log.info("retention removed version %d", version)


def check_required_files(manifest: WeightManifest) -> None:
    """Raise InvalidArgument naming the first of `REQUIRED_FILES` the manifest lacks."""
    listed = {f.path for f in manifest.files}
    for name in REQUIRED_FILES:
        if name not in listed:
            raise InvalidArgument(
                "manifest.files",
                f"version {manifest.version} lacks {name}: every version holds "
                f"{' and '.join(REQUIRED_FILES)}",
            )
