"""The safetensors file format, written into a reusable buffer and read back as views.

The format is small (8-byte header length, JSON header, raw little-endian tensor bytes),
so it is written directly: one `copy_` per tensor into a `bytearray` the caller hands
back for the next version of the same size, where `safetensors.torch.save` allocates and
copies the whole file several times. Tensors are ordered by element size, largest first,
so each starts aligned for its dtype and `safetensors_views` hands out zero-copy views.
Both directions are pinned bit-equal to the `safetensors` package in tests.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping

import torch

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
    torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}  # safetensors name → dtype


def encode_safetensors(
    tensors: Mapping[str, torch.Tensor],
    *,
    metadata: dict[str, str] | None = None,
    reuse: bytearray | None = None,
) -> bytearray:
    """The safetensors file of `tensors`, written into `reuse` when it has exactly the
    needed size (a previous version of the same shapes), else into a new buffer."""
    order = sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0]))
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    spans: list[tuple[torch.Tensor, int, int]] = []
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
        spans.append((tensor, cursor, cursor + nbytes))
        cursor += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    begin = 8 + len(text)
    total = begin + cursor
    buffer = reuse if reuse is not None and len(reuse) == total else bytearray(total)
    struct.pack_into("<Q", buffer, 0, len(text))
    buffer[8:begin] = text
    flat = torch.frombuffer(buffer, dtype=torch.uint8)  # (total,)
    for tensor, start, stop in spans:
        if stop > start:
            raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            flat[begin + start : begin + stop].copy_(raw)  # (nbytes,)
    return buffer


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
