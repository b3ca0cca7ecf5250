"""The codec of a version's files: state dict + HF config ⇄ safetensors + config.json bytes.

Decisions:
- Every path moves exactly these files (same manifest, same sha256): the filesystem
  path writes them (`folder.write_version`), the stream path uploads them, so weightsync
  stores an uploaded version like any other and a replica may fetch any version,
  whichever path published it.
- Encoding writes the safetensors bytes itself into one buffer the caller may hand back
  for the next version (`safetensors_writer`; `safetensors.torch.save` made three fresh
  1 GB copies). `encode_files` does not hash (the folder writer hashes while it writes);
  `encode_version` hashes the buffers once for an upload. Decoding does not use
  `safetensors.torch.load`: it accepts only `bytes` and copies every tensor out of them,
  so a fetched 1 GB version would be copied twice (bytearray → bytes → tensors) before the
  engine's own copy. `decode_version` instead reads the safetensors header (8-byte
  little-endian length, then JSON: dtype, shape, data_offsets per tensor) and returns
  `torch.frombuffer` views of the received buffer: zero copies, and the engine's load is
  the one copy. `tests/unit/weightsync/test_stream_decode.py` pins it bit-equal to
  `safetensors.torch.load`. Checksums are verified by the caller before decoding.
- A version may carry companion files beside the two it always has (`extra_files`: the
  tokenizer files and `generation_config.json` that make it a complete Hugging Face
  folder). They are ordinary files of the version: in its manifest with their sha256,
  moved by every path, verified by every reader. Decoding ignores them.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import torch

from tidal.weights.manifest import (
    CONFIG_FILE,
    FULL_WEIGHTS,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    WeightFile,
    WeightManifest,
)
from tidal.weights.safetensors_writer import DTYPE_NAMES, encode_safetensors

UPLOAD_LOCATION = "(uploaded)"
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}  # safetensors name → dtype


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
    """The files of one version (not hashed); the weights file reuses `reuse` when it fits.
    `extra_files` (name → bytes) are added as they are; they may not replace the version's
    own files."""
    extra = dict(extra_files or {})
    clash = sorted(extra.keys() & {WEIGHTS_FILE, CONFIG_FILE, MANIFEST_FILE})
    if clash or any("/" in name or name.startswith(".") for name in extra):
        raise ValueError(f"companion file names {sorted(extra)} must be plain, new names")
    return {
        WEIGHTS_FILE: encode_safetensors(state_dict, metadata={"format": "pt"}, reuse=reuse),
        CONFIG_FILE: json.dumps(config, indent=2).encode(),
        **extra,
    }


def decode_version(
    files: Mapping[str, bytes | bytearray],
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(HF config, state dict) from verified files; tensors view the weights buffer."""
    return json.loads(bytes(files[CONFIG_FILE])), safetensors_views(files[WEIGHTS_FILE])


def safetensors_views(data: bytes | bytearray) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors payload as views of `data` (a writable bytearray gives
    writable views; read-only `bytes` are copied once, as torch needs a writable buffer)."""
    buffer = data if isinstance(data, bytearray) else bytearray(data)
    if len(buffer) < 8:
        raise ValueError(f"safetensors payload of {len(buffer)} bytes has no header")
    (header_len,) = struct.unpack_from("<Q", buffer, 0)
    begin = 8 + header_len
    if begin > len(buffer):
        raise ValueError(f"safetensors header of {header_len} bytes overruns the payload")
    header = json.loads(bytes(buffer[8:begin]))
    tensors: dict[str, torch.Tensor] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(spec["dtype"])
        if dtype is None:
            raise ValueError(f"{name}: unsupported safetensors dtype {spec['dtype']!r}")
        start, stop = (begin + int(o) for o in spec["data_offsets"])
        shape = [int(d) for d in spec["shape"]]
        if stop > len(buffer) or stop - start != dtype.itemsize * math.prod(shape):
            raise ValueError(f"{name}: data_offsets {spec['data_offsets']} do not fit its shape")
        if start == stop:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=torch.uint8, offset=start, count=stop - start)
        tensors[name] = flat.view(dtype).view(shape)  # (bytes,) → (*shape,)
    return tensors
