"""Hand-coded weight chunks are byte-equal to the generated protobuf classes, both ways."""

from __future__ import annotations

import pytest

from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.weights.chunk_wire import decode_chunk, encode_chunk, encode_upload_chunk, upload_item

CASES = [
    ("model.safetensors", 0, b""),
    ("model.safetensors", 0, b"\x00\x01\x02"),
    ("config.json", 4 << 20, bytes(range(256)) * 3),
    ("", 123, b"x"),
    ("sub/dir/é.bin", (1 << 40) + 7, b"y" * 200),
    ("neg", -5, b"z"),
]


@pytest.mark.parametrize(("path", "offset", "data"), CASES)
def test_encoded_chunk_equals_protobuf_serialization(path: str, offset: int, data: bytes) -> None:
    message = pb.WeightChunk(path=path, offset=offset, data=data)
    assert encode_chunk(path, offset, memoryview(bytearray(data))) == message.SerializeToString()


@pytest.mark.parametrize(("path", "offset", "data"), CASES)
def test_encoded_upload_chunk_equals_protobuf_serialization(
    path: str, offset: int, data: bytes
) -> None:
    message = pb.UploadWeightsRequest(chunk=pb.WeightChunk(path=path, offset=offset, data=data))
    assert encode_upload_chunk(path, offset, data) == message.SerializeToString()


@pytest.mark.parametrize(("path", "offset", "data"), CASES)
def test_decoded_chunk_equals_protobuf_parse(path: str, offset: int, data: bytes) -> None:
    raw = pb.WeightChunk(path=path, offset=offset, data=data).SerializeToString()
    chunk = decode_chunk(raw)
    assert (chunk.path, chunk.offset, bytes(chunk.data)) == (path, offset, data)


def test_decoded_chunk_views_the_message_without_copying() -> None:
    raw = encode_chunk("w", 8, b"payload")
    assert decode_chunk(raw).data.obj is raw


def test_decode_skips_unknown_fields() -> None:
    known = pb.WeightChunk(path="w", offset=3, data=b"abc").SerializeToString()
    unknown = b"\x20\x05" + b"\x2a\x02hi" + b"\x31" + bytes(8) + b"\x3d" + bytes(4)
    chunk = decode_chunk(unknown + known)
    assert (chunk.path, chunk.offset, bytes(chunk.data)) == ("w", 3, b"abc")


@pytest.mark.parametrize("raw", [b"\x1a\x05abc", b"\x10", b"\x10\xff", b"\x0b"])
def test_decode_refuses_malformed_messages(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_chunk(raw)


def test_upload_item_tells_manifest_from_chunk() -> None:
    manifest = pb.WeightManifest(version=3, step=3, format="safetensors")
    raw = pb.UploadWeightsRequest(manifest=manifest).SerializeToString()
    item, body = upload_item(raw)
    assert item == "manifest"
    assert pb.WeightManifest.FromString(bytes(body)) == manifest
    item, body = upload_item(encode_upload_chunk("w", 0, b"abc"))
    assert item == "chunk"
    assert bytes(decode_chunk(body).data) == b"abc"
    assert upload_item(b"") == ("", memoryview(b""))
