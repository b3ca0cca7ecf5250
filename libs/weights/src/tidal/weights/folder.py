"""The on-disk format of a version: `v<N>/` with its files and manifest, published
atomically.

Files go into a hidden temp folder, each fsynced and hashed as it is written, the
manifest last; one rename makes the version visible. A crash leaves a complete `v<N>` or
a temp folder readers ignore and the next publish sweeps. `stage_files` stops before the
rename, so the trainer can write a version while its checkpoint is saved and commit it
after. `load_version` reads each file once, verifying it as it lands. torch is imported
lazily: weightsync itself only names and sweeps folders.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.common.files.durable import (
    IO_SLICE,
    commit_dir,
    fsync_path,
    removed_on_failure,
    space_for,
    write_hashed,
)
from tidal.common.files.safe_remove import remove_inside
from tidal.weights.manifest import (
    FULL_WEIGHTS,
    MANIFEST_FILE,
    WeightFile,
    WeightManifest,
    checked_size,
    verify_digests,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

TMP_PREFIX = ".tmp-"


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:06d}"


def sweep_partial(root: Path) -> None:
    """Remove temp folders left by crashed publishes."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(TMP_PREFIX):
                remove_inside(child, root, ignore_errors=True)


def write_version(
    root: Path,
    *,
    version: int,
    step: int,
    state_dict: Mapping[str, torch.Tensor],
    config: dict[str, Any],
    format: str = FULL_WEIGHTS,
    base_version: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> WeightManifest:
    """Write one version atomically and return its manifest (location = final folder);
    `format`/`base_version` describe LoRA adapter versions (`LORA_ADAPTERS`);
    `extra_files` are companion files (tokenizer, generation config) in the manifest."""
    from tidal.weights.codec import encode_files

    files = encode_files(state_dict=state_dict, config=config, extra_files=extra_files)
    staged = stage_files(
        root, version=version, step=step, files=files, format=format, base_version=base_version
    )
    return staged.commit()


@dataclass
class StagedVersion:
    """A version folder written and fsynced under a hidden temp name: invisible to
    weightsync (its recovery sweeps temp folders, never adopts them) until `commit`."""

    tmp: Path
    manifest: WeightManifest
    committed: bool = False

    def commit(self) -> WeightManifest:
        """Rename the folder to `v<version>` (atomic, durable); idempotent."""
        if not self.committed:
            commit_dir(self.tmp, Path(self.manifest.location))
            self.committed = True
        return self.manifest

    def discard(self) -> None:
        """Remove the hidden folder unless committed (its step's writes failed: a retry
        stages again, and a full disk gets its space back now)."""
        if not self.committed:
            remove_inside(self.tmp, self.tmp.parent, ignore_errors=True)


def stage_files(
    root: Path,
    *,
    version: int,
    step: int,
    files: Mapping[str, bytes | bytearray],
    format: str = FULL_WEIGHTS,
    base_version: int | None = None,
) -> StagedVersion:
    """Write a version's encoded files (`codec.encode_files`) and manifest into a hidden
    temp folder, every file fsynced, hashed as it is written: everything up to, not
    including, the rename that makes the version visible (`StagedVersion.commit`). The
    trainer stages a version while its checkpoint is written and commits it after."""
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    if final.exists():
        raise FileExistsError(f"version {version} already exists at {final}")
    sweep_partial(root)
    tmp = root / f"{TMP_PREFIX}v{version:06d}-{uuid.uuid4().hex[:8]}"
    with space_for(tmp, None), removed_on_failure(tmp):  # a failed write leaks no space
        tmp.mkdir()
        entries = tuple(
            WeightFile(name, len(data), write_hashed(tmp / name, [data]))
            for name, data in files.items()
        )
        manifest = WeightManifest(version, step, str(final), entries, format, base_version)
        text = manifest.to_json().encode()
        with space_for(tmp / MANIFEST_FILE, len(text)):
            (tmp / MANIFEST_FILE).write_bytes(text)
        fsync_path(tmp / MANIFEST_FILE)
    return StagedVersion(tmp, manifest)


def load_version(
    manifest: WeightManifest, *, device: Any = "cpu"
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read and verify every file in one pass, then return (HF config dict, state dict)."""
    from tidal.weights.codec import decode_version

    root = Path(manifest.location)
    buffers: dict[str, bytearray] = {}
    received: dict[str, tuple[int, str]] = {}
    for f in manifest.files:
        buffers[f.path], received[f.path] = _read_hashed(manifest.version, root / f.path, f)
    verify_digests(manifest, received)
    config, state = decode_version(buffers)
    if str(device) != "cpu":
        state = {k: v.to(device) for k, v in state.items()}
    return config, state


def _read_hashed(version: int, path: Path, f: WeightFile) -> tuple[bytearray, tuple[int, str]]:
    """The file's bytes (at most the manifest's size) and (size on disk, sha256)."""
    size = checked_size(version, path, f)
    buffer = bytearray(size)
    view = memoryview(buffer)
    digest = hashlib.sha256()
    done = 0
    with path.open("rb", buffering=0) as handle:
        while done < size and (n := handle.readinto(view[done : done + IO_SLICE])):
            digest.update(view[done : done + n])
            done += n
    return buffer, (done, digest.hexdigest())
