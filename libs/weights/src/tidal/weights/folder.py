"""The on-disk format of a version: `v<N>/` with safetensors, config.json and manifest,
published atomically.

Publish writes everything into a hidden temp folder next to the final one, fsyncs each
file, writes the manifest last, fsyncs, then renames the folder to `v<version>` and fsyncs
the parent. A crash at any point leaves either no `v<version>` folder or a complete one;
temp folders are ignored by readers and swept on the next publish. Readers verify every
sha256 before loading (`load_version`), so a corrupted file is refused, not loaded.

Each side hashes once. `write_version` encodes the files in memory (`codec.encode_files`; a
sender passes the previous version's buffer back to it) and `stage_files` hashes the bytes
on a second thread while it writes them (`tidal.common.files.durable.write_hashed`), with no
second read of the file (it used to be `safetensors.torch.save_file`, then `sha256_file`
re-reading it). `stage_files` stops before the rename: the trainer writes a version
while its checkpoint is being saved and makes it visible (`StagedVersion.commit`) only
once the checkpoint is complete (tidal.trainer.background_persist).
`load_version` reads each file once: into a buffer of its manifest size, hashing each
slice as it lands, then hands out tensors that view that buffer (`safetensors_views`),
so the engine's load is the only copy after the read.

torch is imported lazily: the weightsync service itself (which only sweeps and names
version folders) does not need it.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.common.files.durable import IO_SLICE, commit_dir, fsync_path, write_hashed
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
    tmp.mkdir()
    entries = tuple(
        WeightFile(name, len(data), write_hashed(tmp / name, [data]))
        for name, data in files.items()
    )
    manifest = WeightManifest(version, step, str(final), entries, format, base_version)
    (tmp / MANIFEST_FILE).write_text(manifest.to_json())
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
