"""Tensor codec round trips and rejects malformed tensors naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tidal.batch.tensor_codec import decode_array, decode_tensor, encode_array, encode_tensor
from tidal.common.errors import InvalidArgument


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "uint8", "float16", "bool"])
def test_numpy_round_trip(dtype: str) -> None:
    array = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    out = decode_array(encode_array(array))
    assert out.dtype == array.dtype and np.array_equal(out, array)


def test_torch_round_trip_including_bfloat16() -> None:
    for t in (torch.randn(2, 3), torch.randn(5).to(torch.bfloat16), torch.arange(4)):
        out = decode_tensor(encode_tensor(t))
        assert out.dtype == t.dtype and torch.equal(out, t)


def test_bfloat16_is_two_bytes_per_element() -> None:
    assert len(encode_tensor(torch.zeros(10, dtype=torch.bfloat16)).data) == 20


def test_size_mismatch_names_the_field() -> None:
    message = encode_array(np.zeros(4, dtype=np.float32))
    message.shape[:] = [5]
    with pytest.raises(InvalidArgument, match=r"micro_batches\[0\].loss_mask.data"):
        decode_array(message, field="micro_batches[0].loss_mask")


def test_unknown_dtype_names_the_field() -> None:
    message = encode_array(np.zeros(1, dtype=np.float32))
    message.dtype = "complex7"
    with pytest.raises(InvalidArgument, match=r"x\.dtype"):
        decode_array(message, field="x")
