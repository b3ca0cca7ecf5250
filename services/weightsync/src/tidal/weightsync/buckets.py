"""Fixed-size buckets over a state dict's bytes: the unit the broadcast path sends.

Decisions:
- The state dict is treated as one byte stream (tensors in a fixed order, each as its raw
  little-endian bytes) cut into buckets of `bucket_bytes`; a tensor larger than a bucket
  simply spans several. Every dtype (bf16, fp32, int) goes through the same uint8 view,
  so there is no per-dtype bucketing and the receiver gets bit-identical bytes.
- Sender and receiver compute the same plan from the same `TensorSpec` list (which the
  sender broadcasts first), so only raw bucket bytes cross the wire afterwards.
- Sharded (FSDP/DTensor) weights are gathered by one function, `gather_full_tensor`,
  called lazily one tensor at a time while buckets are packed: a rank never holds more
  than one full tensor plus one bucket beyond its shard, never the whole model. Every
  trainer rank must run `iter_packed_buckets` (the gather is a collective); only rank 0
  sends what it yields.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch


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
        count = 1
        for size in self.shape:
            count *= size
        return count * self.torch_dtype.itemsize

    def to_json(self) -> list[Any]:
        return [self.name, self.dtype, list(self.shape)]

    @classmethod
    def from_json(cls, item: list[Any]) -> TensorSpec:
        name, dtype, shape = item
        return cls(str(name), str(dtype), tuple(int(s) for s in shape))


@dataclass(frozen=True)
class Piece:
    """Bytes [start, stop) of tensor `index`, placed at `bucket_offset` in its bucket."""

    index: int
    start: int
    stop: int
    bucket_offset: int


def specs_of(state_dict: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    """Names, dtypes and (global, for DTensors) shapes, without gathering anything."""
    return [
        TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        for name, t in state_dict.items()
    ]


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[Piece]]:
    """Cut the concatenated bytes of `specs` into buckets of at most `bucket_bytes`."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[Piece]] = []
    current: list[Piece] = []
    used = 0
    for index, spec in enumerate(specs):
        start, total = 0, spec.nbytes
        while start < total:
            take = min(total - start, bucket_bytes - used)
            current.append(Piece(index, start, start + take, used))
            start += take
            used += take
            if used == bucket_bytes:
                buckets.append(current)
                current, used = [], 0
    if current:
        buckets.append(current)
    return buckets


def bucket_size(pieces: list[Piece]) -> int:
    return pieces[-1].bucket_offset + pieces[-1].stop - pieces[-1].start if pieces else 0


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
    state_dict: Mapping[str, torch.Tensor], plan: list[list[Piece]], buffer: torch.Tensor
) -> Iterator[torch.Tensor]:
    """Yield `buffer[:size]` filled with each bucket in turn (the same buffer every time).

    Full tensors are gathered one at a time, when their first byte is packed.
    """
    tensors = list(state_dict.values())
    held_index, held = -1, torch.empty(0, dtype=torch.uint8)
    for pieces in plan:
        for piece in pieces:
            if piece.index != held_index:
                full = gather_full_tensor(tensors[piece.index]).detach()
                held_index, held = piece.index, byte_view(full.to(buffer.device))
            length = piece.stop - piece.start
            buffer[piece.bucket_offset : piece.bucket_offset + length].copy_(
                held[piece.start : piece.stop]
            )
        yield buffer[: bucket_size(pieces)]


def unpack_bucket(bucket: torch.Tensor, pieces: list[Piece], views: list[torch.Tensor]) -> None:
    """Copy a received bucket's pieces into the destination tensors' byte views."""
    for piece in pieces:
        length = piece.stop - piece.start
        views[piece.index][piece.start : piece.stop].copy_(
            bucket[piece.bucket_offset : piece.bucket_offset + length]
        )


def empty_like_specs(specs: list[TensorSpec], device: torch.device) -> dict[str, torch.Tensor]:
    return {s.name: torch.empty(s.shape, dtype=s.torch_dtype, device=device) for s in specs}
