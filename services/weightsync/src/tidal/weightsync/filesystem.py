"""Shared-filesystem data path: safetensors + config.json + manifest, published atomically.

Publish writes everything into a hidden temp folder next to the final one, fsyncs each
file, writes the manifest last, fsyncs, then renames the folder to `v<version>` and fsyncs
the parent. A crash at any point leaves either no `v<version>` folder or a complete one;
temp folders are ignored by readers and swept on the next publish. Readers verify every
sha256 before loading (`load_version`), so a corrupted file is refused, not loaded.

`load_version` reads each file once: into a buffer of its manifest size, hashing each
slice as it lands, then hands out tensors that view that buffer (`safetensors_views`).
Verifying and loading used to be two passes over the file (`sha256_file`, then
`safetensors.torch.load_file`'s copy); now the engine's load is the only copy after the
read.

torch and safetensors are imported lazily: the weightsync service itself (which only
checks manifests) does not need them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.common.durable import commit_dir, fsync_path
from tidal.weightsync.manifest import (
    FULL_WEIGHTS,
    MANIFEST_FILE,
    WeightFile,
    WeightManifest,
    checked_size,
    sha256_file,
    verify_digests,
)

if TYPE_CHECKING:
    import torch

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TMP_PREFIX = ".tmp-"


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:06d}"


def sweep_partial(root: Path) -> None:
    """Remove temp folders left by crashed publishes."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(TMP_PREFIX):
                shutil.rmtree(child, ignore_errors=True)


def write_version(
    root: Path,
    *,
    version: int,
    step: int,
    state_dict: dict[str, torch.Tensor],
    config: dict[str, Any],
    format: str = FULL_WEIGHTS,
    base_version: int | None = None,
) -> WeightManifest:
    """Write one version atomically and return its manifest (location = final folder);
    `format`/`base_version` describe LoRA adapter versions (`LORA_ADAPTERS`)."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    if final.exists():
        raise FileExistsError(f"version {version} already exists at {final}")
    sweep_partial(root)
    tmp = root / f"{TMP_PREFIX}v{version:06d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    files = []
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        fsync_path(tmp / name)
        files.append(WeightFile(name, (tmp / name).stat().st_size, sha256_file(tmp / name)))
    manifest = WeightManifest(
        version=version,
        step=step,
        location=str(final),
        files=tuple(files),
        format=format,
        base_version=base_version,
    )
    (tmp / MANIFEST_FILE).write_text(manifest.to_json())
    fsync_path(tmp / MANIFEST_FILE)
    commit_dir(tmp, final)
    return manifest


READ_SLICE = 16 << 20


def load_version(
    manifest: WeightManifest, *, device: Any = "cpu"
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read and verify every file in one pass, then return (HF config dict, state dict)."""
    from tidal.weightsync.stream import decode_version

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
        while done < size and (n := handle.readinto(view[done : done + READ_SLICE])):
            digest.update(view[done : done + n])
            done += n
    return buffer, (done, digest.hexdigest())
