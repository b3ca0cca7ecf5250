"""Tensor codec: `tidal.rpc.v1.Tensor {dtype, shape, bytes data}` ⇄ numpy / torch.

Data is raw little-endian bytes in C order, so encoding is one copy and decoding is a
zero-copy view (`np.frombuffer`). Decoding checks the shape against the bytes with
Python integers (an absurd shape such as [2^62, 4] is INVALID_ARGUMENT naming
`<field>.data`, never an int64 overflow). numpy is the common currency because the orchestrator
must not import torch; the torch helpers import it lazily. bfloat16 has no numpy dtype:
it travels as its 2-byte pattern and is re-viewed as `torch.bfloat16` on decode.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from tidal.common.errors import InvalidArgument
from tidal.rpc.v1 import common_pb2

if TYPE_CHECKING:
    import torch

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("tidal.batch.tensor_codec assumes a little-endian host")

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name)
    for name in (
        "float64",
        "float32",
        "float16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
    )
}
MAX_DIMS = 8
"""Most dimensions a decoded tensor may have (every Tidal tensor has at most 4)."""
# bfloat16 is carried as its bit pattern.
_BF16_CARRIER = np.dtype("uint16")


def encode_array(array: np.ndarray) -> common_pb2.Tensor:
    """Encode a numpy array (any of the dtypes in `_NUMPY_DTYPES`)."""
    name = array.dtype.name
    if name not in _NUMPY_DTYPES:
        raise TypeError(f"unsupported numpy dtype {name!r}; supported: {sorted(_NUMPY_DTYPES)}")
    data = np.ascontiguousarray(array).tobytes()
    return common_pb2.Tensor(dtype=name, shape=list(array.shape), data=data)


def decode_array(message: common_pb2.Tensor, *, field: str = "tensor") -> np.ndarray:
    """Decode to a read-only numpy view; `field` names the tensor in error messages."""
    dtype = _NUMPY_DTYPES.get(message.dtype)
    if message.dtype == "bfloat16":
        dtype = _BF16_CARRIER
    if dtype is None:
        raise InvalidArgument(f"{field}.dtype", f"unsupported dtype {message.dtype!r}")
    shape = tuple(int(d) for d in message.shape)
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"{field}.shape", f"{len(shape)} dimensions, at most {MAX_DIMS}")
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"{field}.shape", f"negative dimension in {shape}")
    # Python ints: a product like [2^62, 4] must not wrap around as int64 would.
    expected = math.prod(shape) * dtype.itemsize
    if len(message.data) != expected:
        raise InvalidArgument(
            f"{field}.data",
            f"{len(message.data)} bytes do not match shape {shape} of {message.dtype} "
            f"({expected} bytes expected)",
        )
    return np.frombuffer(message.data, dtype=dtype).reshape(shape)


def encode_tensor(tensor: torch.Tensor) -> common_pb2.Tensor:
    """Encode a torch tensor (moved to CPU, made contiguous)."""
    import torch

    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy().view(_BF16_CARRIER)
        return common_pb2.Tensor(dtype="bfloat16", shape=list(t.shape), data=raw.tobytes())
    return encode_array(t.numpy())


def decode_tensor(message: common_pb2.Tensor, *, field: str = "tensor") -> torch.Tensor:
    """Decode to a torch tensor that owns its memory."""
    import torch

    array = decode_array(message, field=field)
    if message.dtype == "bfloat16":
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())
