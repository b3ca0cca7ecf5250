"""The stream path's zero-copy decoder equals safetensors' own loader, bit for bit."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from tidal.weights.codec import safetensors_views


def test_views_equal_safetensors_load_for_every_dtype_and_share_the_buffer() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "f32": torch.randn(7, generator=g),
        "f16": torch.randn(2, 2, generator=g).to(torch.float16),
        "i64": torch.arange(5, dtype=torch.int64),
        "u8": torch.arange(3, dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    payload = bytearray(save(tensors, metadata={"format": "pt"}))
    views = safetensors_views(payload)
    expected = load(bytes(payload))
    assert views.keys() == expected.keys()
    for name, want in expected.items():
        assert views[name].dtype == want.dtype and views[name].shape == want.shape, name
        assert torch.equal(views[name], want), name
    # Views, not copies: a write into the buffer shows in the tensor.
    before = views["u8"].clone()
    start = payload.rfind(bytes(before.tolist()))
    payload[start] = 99
    assert views["u8"][0].item() == 99


def test_truncated_payload_is_refused_naming_the_tensor() -> None:
    payload = save({"w": torch.ones(16)})
    with pytest.raises(ValueError, match="w: data_offsets"):
        safetensors_views(payload[:-4])
    with pytest.raises(ValueError, match="no header"):
        safetensors_views(b"\x01")
