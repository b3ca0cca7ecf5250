"""A version's files from a state dict and back: a model folder (`model.safetensors`,
`config.json` and its companion files: tokenizer, generation config) under a manifest.

Every data path moves exactly these files under one manifest, so weightsync stores an
uploaded version like a written one and a replica may fetch any version by any path.
The weights file is written into a buffer the caller hands back for the next version,
and decoding returns views of the received buffer, so the engine's load is the one copy.
Hashing is the caller's (once per side), and so is verifying before decoding.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from tidal.models.hf_folder import folder_files
from tidal.models.safetensors_format import safetensors_views
from tidal.weights.manifest import (
    CONFIG_FILE,
    FULL_WEIGHTS,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    WeightFile,
    WeightManifest,
)

UPLOAD_LOCATION = "(uploaded)"


def encode_version(
    *,
    version: int,
    step: int,
    state_dict: Mapping[str, torch.Tensor],
    config: dict[str, Any],
    format: str = FULL_WEIGHTS,
    base_version: int | None = None,
    reuse: bytearray | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> tuple[WeightManifest, dict[str, bytes | bytearray]]:
    """The files of one version and their manifest (location filled in by weightsync).

    The weights file is written into `reuse` (the previous version's weights file) when
    its size fits exactly; the caller must be done uploading that one.
    """
    files = encode_files(state_dict=state_dict, config=config, reuse=reuse, extra_files=extra_files)
    entries = tuple(
        WeightFile(name, len(data), hashlib.sha256(data).hexdigest())
        for name, data in files.items()
    )
    return WeightManifest(version, step, UPLOAD_LOCATION, entries, format, base_version), files


def encode_files(
    *,
    state_dict: Mapping[str, torch.Tensor],
    config: dict[str, Any],
    reuse: bytearray | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> dict[str, bytes | bytearray]:
    """The files of one version (not hashed): the model folder's (`hf_folder.folder_files`),
    whose weights file reuses `reuse` when it fits. `extra_files` (name → bytes) are added
    as they are; they may not replace the version's own files."""
    if MANIFEST_FILE in (extra_files or {}):
        raise ValueError(f"companion file names may not include the version's {MANIFEST_FILE}")
    return folder_files(config, state_dict, extra_files=extra_files, reuse=reuse)


def decode_version(
    files: Mapping[str, bytes | bytearray],
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(HF config, state dict) from verified files; tensors view the weights buffer."""
    return json.loads(bytes(files[CONFIG_FILE])), safetensors_views(files[WEIGHTS_FILE])
