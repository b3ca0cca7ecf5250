"""Bucketing a state dict's bytes: every byte lands once, buckets never exceed their size."""

from __future__ import annotations

import itertools

import pytest
import torch

from tidal.weightsync.buckets import (
    TensorSpec,
    bucket_size,
    byte_view,
    empty_like_specs,
    iter_packed_buckets,
    plan_buckets,
    specs_of,
    unpack_bucket,
)


def mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "emb": torch.randn(37, 11, generator=g).to(torch.bfloat16),  # 814 bytes
        "norm": torch.randn(11, generator=g),  # fp32, 44 bytes
        "steps": torch.arange(5, dtype=torch.int64),
        "scalar": torch.tensor(3.5, dtype=torch.float64),  # 0-d
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(6, 9, generator=g).t(),  # not contiguous
    }


@pytest.mark.parametrize("bucket_bytes", [1, 7, 64, 100, 10_000])
def test_send_and_receive_buckets_is_bit_identical(bucket_bytes: int) -> None:
    state = mixed_state()
    specs = specs_of(state)
    plan = plan_buckets(specs, bucket_bytes)
    received = empty_like_specs(specs, torch.device("cpu"))
    views = [byte_view(t) for t in received.values()]
    buffer = torch.empty(bucket_bytes, dtype=torch.uint8)
    for pieces, bucket in zip(plan, iter_packed_buckets(state, plan, buffer), strict=True):
        assert bucket.numel() == bucket_size(pieces) <= bucket_bytes
        unpack_bucket(bucket.clone(), pieces, views)
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape
        assert torch.equal(byte_view(received[name]), byte_view(tensor)), name


def test_plan_covers_every_byte_once_and_fills_buckets() -> None:
    specs = specs_of(mixed_state())
    total = sum(s.nbytes for s in specs)
    plan = plan_buckets(specs, 100)
    assert [bucket_size(p) for p in plan] == [100] * (total // 100) + [total % 100]
    for index, spec in enumerate(specs):
        pieces = [p for bucket in plan for p in bucket if p.index == index]
        covered = sum(p.stop - p.start for p in pieces)
        assert covered == spec.nbytes
        assert all(a.stop == b.start for a, b in itertools.pairwise(pieces))


def test_specs_round_trip_json_and_refuse_unknown_dtypes() -> None:
    spec = TensorSpec("w", "bfloat16", (2, 3))
    assert TensorSpec.from_json(spec.to_json()) == spec and spec.nbytes == 12
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        _ = TensorSpec("w", "float99", (1,)).nbytes
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        plan_buckets([spec], 0)
