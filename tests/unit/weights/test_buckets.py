"""Bucketing a state dict's bytes: every byte lands once, buckets never exceed their size."""

from __future__ import annotations

import itertools

import pytest
import torch

from tidal.weights.buckets import (
    ALIGN,
    TensorSpec,
    byte_view,
    iter_packed_buckets,
    layout_of,
    specs_of,
    tensor_views,
)


def mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "flags": torch.tensor([1, 0, 1], dtype=torch.uint8),  # odd size: next one is padded
        "emb": torch.randn(37, 11, generator=g).to(torch.bfloat16),
        "norm": torch.randn(11, generator=g),
        "steps": torch.arange(5, dtype=torch.int64),
        "scalar": torch.tensor(3.5, dtype=torch.float64),  # 0-d
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(6, 9, generator=g).t(),  # not contiguous
    }


@pytest.mark.parametrize(
    ("bucket_bytes", "buffers"), [(1, 1), (7, 2), (64, 2), (100, 1), (10_000, 2)]
)
def test_buckets_received_into_a_flat_buffer_are_bit_identical(
    bucket_bytes: int, buffers: int
) -> None:
    state = mixed_state()
    layout = layout_of(specs_of(state))
    flat = torch.zeros(layout.total_bytes, dtype=torch.uint8)  # the receiver's buffer
    ranges = layout.buckets(bucket_bytes)
    pool = [torch.empty(bucket_bytes, dtype=torch.uint8) for _ in range(buffers)]
    packed = iter_packed_buckets(state, layout, bucket_bytes, pool)
    for (start, stop), bucket in zip(ranges, packed, strict=True):
        assert bucket.numel() == stop - start <= bucket_bytes
        flat[start:stop].copy_(bucket)  # what a broadcast into the slice does
    received = tensor_views(flat, layout)
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape
        assert torch.equal(byte_view(received[name]), byte_view(tensor)), name


def test_layout_aligns_every_tensor_and_buckets_cover_it_once() -> None:
    specs = specs_of(mixed_state())
    layout = layout_of(specs)
    assert all(offset % ALIGN == 0 for offset in layout.offsets)
    for (spec, a), b in zip(
        zip(specs, layout.offsets, strict=True), layout.offsets[1:], strict=False
    ):
        assert a + spec.nbytes <= b  # no overlap
    assert layout.total_bytes == layout.offsets[-1] + specs[-1].nbytes
    ranges = layout.buckets(100)
    assert ranges[0][0] == 0 and ranges[-1][1] == layout.total_bytes
    assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(ranges))


def test_specs_round_trip_json_and_refuse_unknown_dtypes() -> None:
    spec = TensorSpec("w", "bfloat16", (2, 3))
    assert TensorSpec.from_json(spec.to_json()) == spec and spec.nbytes == 12
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        _ = TensorSpec("w", "float99", (1,)).nbytes
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        layout_of([spec]).buckets(0)
