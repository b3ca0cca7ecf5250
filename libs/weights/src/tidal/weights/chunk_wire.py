"""`WeightChunk` messages encoded and decoded by hand: one copy of the bytes, not three.

The generated protobuf classes copy a chunk's payload when a message is built, when it
is serialized, when it is parsed and when `data` is read; at a few hundred MB per
version these copies, on the event loop thread, cost more than the transfer. The
chunk's wire format is three fields, so it is written here directly (header, then the
payload in one `join`) and read back as a view of the received message. Both directions
are pinned byte-equal to the generated classes in tests.
"""

from __future__ import annotations

from dataclasses import dataclass

_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5  # protobuf wire types
_PATH, _OFFSET, _DATA = 1, 2, 3  # WeightChunk field numbers
_UPLOAD_MANIFEST, _UPLOAD_CHUNK = 1, 2  # UploadWeightsRequest's `item` fields


@dataclass(frozen=True)
class ChunkView:
    """A decoded chunk; `data` views the received message (no copy)."""

    path: str
    offset: int
    data: memoryview


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are ten bytes of two's complement
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(raw: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise ValueError("truncated or overlong varint in a WeightChunk")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _chunk_header(path: str, offset: int, size: int) -> bytes:
    """A WeightChunk's bytes up to its payload (default values omitted, as protobuf does)."""
    head = b""
    if path:
        name = path.encode()
        head += _varint(_PATH << 3 | _LEN) + _varint(len(name)) + name
    if offset:
        head += _varint(_OFFSET << 3 | _VARINT) + _varint(offset)
    if size:
        head += _varint(_DATA << 3 | _LEN) + _varint(size)
    return head


def encode_chunk(path: str, offset: int, data: bytes | bytearray | memoryview) -> bytes:
    """A serialized `WeightChunk`."""
    return b"".join((_chunk_header(path, offset, len(data)), data))


def encode_upload_chunk(path: str, offset: int, data: bytes | bytearray | memoryview) -> bytes:
    """A serialized `UploadWeightsRequest` whose `item` is this chunk."""
    head = _chunk_header(path, offset, len(data))
    size = len(head) + len(data)
    return b"".join((_varint(_UPLOAD_CHUNK << 3 | _LEN), _varint(size), head, data))


def _fields(raw: memoryview) -> list[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of every field: length-delimited values as views."""
    fields: list[tuple[int, int, int | memoryview]] = []
    pos = 0
    while pos < len(raw):
        key, pos = _read_varint(raw, pos)
        number, kind = key >> 3, key & 7
        value: int | memoryview
        if kind == _VARINT:
            value, pos = _read_varint(raw, pos)
        elif kind == _LEN:
            size, pos = _read_varint(raw, pos)
            if pos + size > len(raw):
                raise ValueError("a WeightChunk field runs past the end of the message")
            value, pos = raw[pos : pos + size], pos + size
        elif kind in (_I64, _I32):
            width = 8 if kind == _I64 else 4
            value, pos = int.from_bytes(raw[pos : pos + width], "little"), pos + width
        else:
            raise ValueError(f"unsupported protobuf wire type {kind} in a WeightChunk")
        fields.append((number, kind, value))
    if pos != len(raw):
        raise ValueError("a WeightChunk field runs past the end of the message")
    return fields


def decode_chunk(raw: bytes | memoryview) -> ChunkView:
    """A serialized `WeightChunk` (unknown fields skipped; the last of a repeated field wins)."""
    path, offset, data = "", 0, memoryview(b"")
    for number, kind, value in _fields(memoryview(raw)):
        if number == _PATH and isinstance(value, memoryview):
            path = bytes(value).decode()
        elif number == _OFFSET and kind == _VARINT:
            offset = value - (1 << 64) if value >= 1 << 63 else value  # type: ignore[operator]
        elif number == _DATA and isinstance(value, memoryview):
            data = value
    return ChunkView(path, offset, data)


def upload_item(raw: bytes) -> tuple[str, memoryview]:
    """An `UploadWeightsRequest`'s `item`: ("manifest" | "chunk" | "", the field's bytes)."""
    item, body = "", memoryview(b"")
    for number, _, value in _fields(memoryview(raw)):
        if number in (_UPLOAD_MANIFEST, _UPLOAD_CHUNK) and isinstance(value, memoryview):
            item = "manifest" if number == _UPLOAD_MANIFEST else "chunk"
            body = value
    return item, body
