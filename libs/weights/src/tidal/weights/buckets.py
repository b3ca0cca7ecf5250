"""Fixed-size buckets over a state dict's bytes: the unit the broadcast path sends.

The state dict is one byte stream (tensors in a fixed order, each 64-byte aligned) cut
into buckets; a tensor may span several. Sender and receiver compute the same `Layout`
from the `TensorSpec` list sent first, so only raw bytes follow, and the receiver's
tensors are dtype views of its one flat buffer. Sharded tensors are gathered lazily, one
at a time (`gather_full_tensor`, a collective every trainer rank must run), so no rank
holds more than one full tensor and one bucket beyond its shard.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    """torch dtype name without the "torch." prefix, e.g. "bfloat16"."""
    shape: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{self.name}: unknown dtype {self.dtype!r}")
        return dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.torch_dtype.itemsize

    def to_json(self) -> list[Any]:
        return [self.name, self.dtype, list(self.shape)]

    @classmethod
    def from_json(cls, item: list[Any]) -> TensorSpec:
        name, dtype, shape = item
        return cls(str(name), str(dtype), tuple(int(s) for s in shape))


@dataclass(frozen=True)
class Layout:
    """Where each tensor's bytes sit in the version's byte stream (64-byte aligned)."""

    specs: tuple[TensorSpec, ...]
    offsets: tuple[int, ...]
    total_bytes: int

    def buckets(self, bucket_bytes: int) -> list[tuple[int, int]]:
        """The [start, stop) byte ranges of consecutive buckets of at most `bucket_bytes`."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        return [
            (start, min(start + bucket_bytes, self.total_bytes))
            for start in range(0, self.total_bytes, bucket_bytes)
        ]


def specs_of(state_dict: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    """Names, dtypes and (global, for DTensors) shapes, without gathering anything."""
    return [
        TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        for name, t in state_dict.items()
    ]


def layout_of(specs: list[TensorSpec]) -> Layout:
    """Tensors back to back, each starting on an ALIGN boundary (so byte views of a flat
    buffer can be viewed as any dtype)."""
    offsets, cursor = [], 0
    for spec in specs:
        cursor = -(-cursor // ALIGN) * ALIGN
        offsets.append(cursor)
        cursor += spec.nbytes
    return Layout(tuple(specs), tuple(offsets), cursor)


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 view (no copy for contiguous tensors)."""
    return t.contiguous().reshape(-1).view(torch.uint8)  # (nbytes,)


def gather_full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on this rank: all-gathers a sharded DTensor, passes others through."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.full_tensor()
    return t


def iter_packed_buckets(
    state_dict: Mapping[str, torch.Tensor],
    layout: Layout,
    bucket_bytes: int,
    buffers: list[torch.Tensor],
) -> Iterator[torch.Tensor]:
    """Yield each bucket packed into `buffers[k % len(buffers)][:size]`.

    With two buffers a caller may send bucket k while bucket k+1 is packed, provided it
    has waited for bucket k-1's send before asking for the next. Full tensors are
    gathered one at a time, when their first byte is packed; padding bytes are unset.
    """
    tensors = list(state_dict.values())
    first = 0  # first tensor that may still have bytes at or after the bucket's start
    held_index, held = -1, torch.empty(0, dtype=torch.uint8)
    for k, (start, stop) in enumerate(layout.buckets(bucket_bytes)):
        buffer = buffers[k % len(buffers)][: stop - start]
        while first < len(tensors) and layout.offsets[first] + layout.specs[first].nbytes <= start:
            first += 1
        j = first
        while j < len(tensors) and layout.offsets[j] < stop:
            offset = layout.offsets[j]
            lo, hi = max(start, offset), min(stop, offset + layout.specs[j].nbytes)
            if hi > lo:
                if j != held_index:
                    full = gather_full_tensor(tensors[j]).detach()
                    held_index, held = j, byte_view(full.to(buffer.device))
                buffer[lo - start : hi - start].copy_(held[lo - offset : hi - offset])
            j += 1
        yield buffer


def tensor_views(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """The state dict as views into one flat uint8 buffer laid out by `layout`."""
    views = {}
    for spec, offset in zip(layout.specs, layout.offsets, strict=True):
        raw = flat[offset : offset + spec.nbytes]
        views[spec.name] = raw.view(spec.torch_dtype).view(spec.shape)
    return views
