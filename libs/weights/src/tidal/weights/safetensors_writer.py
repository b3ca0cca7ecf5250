"""Serialize a state dict to safetensors bytes in one (reusable) buffer.

Decisions:
- `safetensors.torch.save` copies every tensor to a fresh `bytes` (numpy), then builds
  the file in a fresh Rust buffer and returns it as new `bytes`: at 1 GB that is three
  fresh allocations (a page fault per 4 KiB page each) and three copies, which the stream
  path's profile put at 3-12 s under load. The format is small (an 8-byte little-endian
  header length, a JSON header of dtype, shape and data_offsets per tensor, padded with
  spaces to 8 bytes, then the raw little-endian tensor bytes back to back), so this
  module writes it directly: one `Tensor.copy_` per tensor into a `bytearray`, which the
  caller hands back for the next version (same size: no new pages at all).
- Tensors are ordered by element size, largest first, then by name (as safetensors
  does), so with the 8-byte header padding every tensor starts on a multiple of its
  element size and the reader's views (`codec.safetensors_views`) are aligned.
- The output is a valid safetensors file: `tests/unit/weightsync/test_safetensors_writer.py`
  pins `safetensors.torch.load` of it bit-equal to the input for every dtype.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import torch

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
    torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


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
