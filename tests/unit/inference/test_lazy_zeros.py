"""lazy_zeros: the KV caches' zeros, in every cache dtype, writable, page-aligned."""

from __future__ import annotations

import pytest
import torch

from tidal.inference.lazy_zeros import lazy_zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lazy_zeros_are_zeros_like_torch_zeros(dtype: torch.dtype) -> None:
    shape = (2, 64, 3, 8)
    lazy = lazy_zeros(shape, dtype=dtype, device="cpu")
    assert lazy.dtype == dtype and lazy.shape == shape and lazy.is_contiguous()
    assert torch.equal(lazy, torch.zeros(shape, dtype=dtype))
    assert lazy.data_ptr() % 4096 == 0  # a fresh mapping: page-aligned
    lazy[1, 63, 2, 7] = 3.0
    assert lazy.sum().item() == 3.0


def test_empty_shape() -> None:
    assert lazy_zeros((0, 4), dtype=torch.float32, device="cpu").shape == (0, 4)
