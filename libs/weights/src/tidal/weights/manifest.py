"""Domain types of published weights: a version's manifest, its files and their digests.

A manifest is what makes a version trustworthy: every file with its size and sha256.
It is written last into the version's folder (`manifest.json`) and the folder is renamed
into place after that, so a manifest on disk always describes complete files.

Each side hashes a version once: the writer while it writes (`folder.write_version`,
`codec.encode_version`), weightsync once when it registers it (`verify_files`, or while
an upload is written), a replica while it reads or fetches (`verify_digests`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidal.common.errors import FailedPrecondition

MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
"""Every version, whichever path published it, is these two files plus its manifest."""
FULL_WEIGHTS = "safetensors"
LORA_ADAPTERS = "lora-adapters"
"""A version holding only LoRA adapters, applied to the full weights of `base_version`."""
FORMATS = (FULL_WEIGHTS, LORA_ADAPTERS)
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class WeightFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class WeightManifest:
    version: int
    step: int
    location: str
    files: tuple[WeightFile, ...]
    format: str = FULL_WEIGHTS
    base_version: int | None = None
    """For `LORA_ADAPTERS`: the version whose full weights the adapters apply to."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WeightManifest:
        files = tuple(WeightFile(**f) for f in data["files"])
        return cls(
            version=int(data["version"]),
            step=int(data["step"]),
            location=str(data["location"]),
            files=files,
            format=data.get("format", FULL_WEIGHTS),
            base_version=data.get("base_version"),
        )

    @classmethod
    def read(cls, folder: Path) -> WeightManifest:
        return cls.from_dict(json.loads((folder / MANIFEST_FILE).read_text()))


@dataclass(frozen=True)
class VersionEvent:
    """A published version as subscribers see it."""

    manifest: WeightManifest
    trace_context: dict[str, str] = field(default_factory=dict)
    loaded_by: tuple[str, ...] = ()
    published_unix_ms: int = 0


@dataclass(frozen=True)
class LoadedVersions:
    """What weightsync's WatchLoaded pushes: the newest published version and, per
    replica id, the newest version that replica acknowledged (-1: none yet)."""

    published: int
    replicas: dict[str, int] = field(default_factory=dict)


class CorruptWeights(FailedPrecondition):
    """A version's files are missing, truncated or do not match their sha256."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checked_size(version: int, path: Path, f: WeightFile) -> int:
    """`f`'s size on disk at `path`; CorruptWeights if it is missing or not the manifest's."""
    if not path.is_file():
        raise CorruptWeights(f"version {version}: file {f.path} is missing in {path.parent}")
    size = path.stat().st_size
    if size != f.size:
        raise CorruptWeights(
            f"version {version}: file {f.path} has {size} bytes, manifest says {f.size}"
        )
    return size


def verify_files(manifest: WeightManifest) -> None:
    """Raise CorruptWeights naming the first file that is missing or does not match."""
    root = Path(manifest.location)
    for f in manifest.files:
        size = checked_size(manifest.version, root / f.path, f)
        _check_digest(manifest.version, f, size, sha256_file(root / f.path))


def verify_digests(manifest: WeightManifest, received: dict[str, tuple[int, str]]) -> None:
    """Like `verify_files`, for files received in memory: `received` maps each path to
    (size, sha256 hex digest) as computed while receiving it."""
    for f in manifest.files:
        if f.path not in received:
            raise CorruptWeights(f"version {manifest.version}: file {f.path} was not received")
        _check_digest(manifest.version, f, *received[f.path])


def _check_digest(version: int, f: WeightFile, size: int, actual: str) -> None:
    if size != f.size:
        raise CorruptWeights(
            f"version {version}: file {f.path} has {size} bytes, manifest says {f.size}"
        )
    if actual != f.sha256:
        raise CorruptWeights(
            f"version {version}: sha256 of {f.path} is {actual[:12]}…, "
            f"manifest says {f.sha256[:12]}…"
        )
