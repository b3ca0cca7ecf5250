"""The one safetensors writer: a file into a reusable buffer or streamed to disk, and views.

Every safetensors file Tidal writes goes through here: published versions, exported and
imported model folders, checkpoint and journal state files. It is our own encoder, not
`safetensors.torch.save`, because the format is small (8-byte header length, JSON header,
raw little-endian tensor bytes) and writing it directly lets a publish reuse the previous
version's buffer (one `copy_` per tensor, where `save` allocates and copies the whole file
several times) and lets a checkpoint stream each tensor from its own memory to the file and
its sha256 at once (no buffer of the state's size). Tensors are ordered by element size,
largest first, so each starts aligned for its dtype and `safetensors_views` hands out
zero-copy views. Both directions are pinned bit-equal to the `safetensors` package in tests.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

from tidal.common.files.durable import write_hashed

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint64: "U64",
    torch.uint32: "U32", torch.uint16: "U16", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}  # safetensors name → dtype


def safetensors_layout(
    tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> tuple[bytes, list[torch.Tensor]]:
    """The file's header (8-byte length + JSON, space-padded to 8 bytes) and its tensors
    in the order their bytes follow it."""
    order = sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0]))
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    cursor = 0
    for name, tensor in order:
        dtype = DTYPE_NAMES.get(tensor.dtype)
        if dtype is None:
            raise ValueError(f"{name}: dtype {tensor.dtype} has no safetensors name")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": dtype,
            "shape": list(tensor.shape),
            "data_offsets": [cursor, cursor + nbytes],
        }
        cursor += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, [t for _, t in order]


def encode_safetensors(
    tensors: Mapping[str, torch.Tensor],
    *,
    metadata: dict[str, str] | None = None,
    reuse: bytearray | None = None,
) -> bytearray:
    """The safetensors file of `tensors`, written into `reuse` when it has exactly the
    needed size (a previous version of the same shapes), else into a new buffer."""
    header, ordered = safetensors_layout(tensors, metadata)
    total = len(header) + sum(t.numel() * t.element_size() for t in ordered)
    buffer = reuse if reuse is not None and len(reuse) == total else bytearray(total)
    buffer[: len(header)] = header
    flat = torch.frombuffer(buffer, dtype=torch.uint8)  # (total,)
    start = len(header)
    for tensor in ordered:
        raw = _bytes(tensor)  # (nbytes,)
        flat[start : start + len(raw)].copy_(raw)
        start += len(raw)
    return buffer


def write_safetensors(
    path: Path, tensors: Mapping[str, torch.Tensor], *, metadata: dict[str, str] | None = None
) -> str:
    """Write the safetensors file of `tensors` at `path`, fsynced, each tensor's bytes going
    to the file and the hash straight from its memory; returns the file's sha256."""
    header, ordered = safetensors_layout(tensors, metadata)
    return write_hashed(path, [header, *(memoryview(_bytes(t).numpy()) for t in ordered)])


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a CPU uint8 tensor: a view, no copy, of a contiguous CPU tensor."""
    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


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
