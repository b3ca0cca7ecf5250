"""The bytes of a version for the stream path: safetensors + config.json, in memory.

Decisions:
- The stream path moves exactly the files the filesystem path writes (same manifest,
  same sha256), so weightsync stores an uploaded version like any other and a replica
  may fetch any version, whichever path published it.
- Encoding uses `safetensors.torch.save` (bytes, no temp file); decoding
  `safetensors.torch.load`. Checksums are verified by the caller before decoding.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import load, save

from tidal.weightsync.filesystem import CONFIG_FILE, WEIGHTS_FILE
from tidal.weightsync.manifest import FULL_WEIGHTS, WeightFile, WeightManifest

UPLOAD_LOCATION = "(uploaded)"


def encode_version(
    *,
    version: int,
    step: int,
    state_dict: Mapping[str, torch.Tensor],
    config: dict[str, Any],
    format: str = FULL_WEIGHTS,
    base_version: int | None = None,
) -> tuple[WeightManifest, dict[str, bytes]]:
    """The files of one version and their manifest (location filled in by weightsync)."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    files = {
        WEIGHTS_FILE: save(tensors, metadata={"format": "pt"}),
        CONFIG_FILE: json.dumps(config, indent=2).encode(),
    }
    entries = tuple(
        WeightFile(name, len(data), hashlib.sha256(data).hexdigest())
        for name, data in files.items()
    )
    return WeightManifest(version, step, UPLOAD_LOCATION, entries, format, base_version), files


def decode_version(files: Mapping[str, bytes]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(HF config, state dict) from verified files."""
    return json.loads(files[CONFIG_FILE]), load(files[WEIGHTS_FILE])
