"""The safetensors format both ways: files safetensors itself loads (in a buffer or
streamed to disk), and zero-copy views equal to its own loader, bit for bit."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, save

from tidal.models.safetensors_format import (
    encode_safetensors,
    safetensors_views,
    write_safetensors,
)


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "f32": torch.randn(7, generator=g),
        "f16": torch.randn(2, 3, generator=g).to(torch.float16),
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
        "i64": torch.arange(5, dtype=torch.int64) * seed,
        "i32": torch.arange(3, dtype=torch.int32),
        "u8": torch.arange(3, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(4, 6, generator=g).t(),  # non-contiguous (6, 4)
    }


def test_safetensors_load_of_the_written_bytes_equals_the_input_for_every_dtype() -> None:
    sent = tensors(1)
    payload = encode_safetensors(sent, metadata={"format": "pt"})
    loaded = load(bytes(payload))
    assert loaded.keys() == sent.keys()
    for name, want in sent.items():
        assert loaded[name].dtype == want.dtype and loaded[name].shape == want.shape, name
        assert torch.equal(loaded[name], want), name
    views = safetensors_views(payload)  # the replica's zero-copy reader agrees
    assert all(torch.equal(views[k], v) for k, v in sent.items())
    assert all(views[k].data_ptr() % views[k].element_size() == 0 for k in sent)


def test_the_wider_dtypes_safetensors_writes_are_written_and_read_bit_equal() -> None:
    ints = torch.tensor([1, 2, 60000])
    sent = {
        "f8_e4m3": torch.tensor([0.5, -2.0, 3.0]).to(torch.float8_e4m3fn),
        "f8_e5m2": torch.tensor([0.5, -2.0, 3.0]).to(torch.float8_e5m2),
        **{f"u{bits}": ints.to(getattr(torch, f"uint{bits}")) for bits in (16, 32, 64)},
    }
    payload = encode_safetensors(sent)
    assert bytes(payload) == save(sent)  # safetensors' own file, byte for byte
    for loaded in (load(bytes(payload)), safetensors_views(payload)):
        for name, want in sent.items():
            assert loaded[name].dtype == want.dtype, name
            assert torch.equal(loaded[name].view(torch.uint8), want.view(torch.uint8)), name


def test_a_buffer_of_the_right_size_is_rewritten_in_place() -> None:
    first = encode_safetensors(tensors(1))
    second = encode_safetensors(tensors(2), reuse=first)
    assert second is first
    assert all(torch.equal(load(bytes(second))[k], v) for k, v in tensors(2).items())
    other = encode_safetensors({"w": torch.ones(3)}, reuse=first)
    assert other is not first and torch.equal(load(bytes(other))["w"], torch.ones(3))


def test_a_dtype_without_a_safetensors_name_is_refused_naming_the_tensor() -> None:
    with pytest.raises(ValueError, match=r"c: dtype torch\.complex64"):
        encode_safetensors({"c": torch.zeros(2, dtype=torch.complex64)})


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


def test_the_streamed_file_is_the_encoded_buffer_and_its_sha256_is_returned(tmp_path: Path) -> None:
    sent = tensors(3)
    digest = write_safetensors(tmp_path / "w.safetensors", sent, metadata={"format": "pt"})
    data = (tmp_path / "w.safetensors").read_bytes()
    assert data == bytes(encode_safetensors(sent, metadata={"format": "pt"}))
    assert digest == hashlib.sha256(data).hexdigest()
