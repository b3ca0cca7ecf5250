"""The stream path resumes a cut transfer from its offset, not from zero.

Transfers are cut for real: the client talks to the real weightsync server through a TCP
proxy that closes the connection once a set number of bytes has crossed it in one
direction (once; later connections pass through). The proxy counts the bytes of every
connection, which is how the tests see that the resumed transfer did not start over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import torch

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.rpc.v1 import weightsync_pb2_grpc as pb_grpc
from tidal.weights.client import WeightSyncClient
from tidal.weights.codec import decode_version, encode_version
from tidal.weights.wire import manifest_to_proto
from tidal.weightsync.config import StreamTransport

WEIGHTS = "model.safetensors"


@dataclass
class CuttingProxy:
    """TCP proxy to `upstream` that cuts the first connection after `cut_after` bytes in
    `direction` ("up": client → server, "down": server → client)."""

    upstream: tuple[str, int]
    direction: str
    cut_after: int
    before_cut: Callable[[], Awaitable[bool]] | None = None
    """Polled once `cut_after` bytes have crossed, reading no more meanwhile: the cut waits
    until it holds (the server reports what it has received, not what is still queued)."""
    sent: list[dict[str, int]] = field(default_factory=list)  # per connection and direction
    cut: bool = False
    port: int = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        counts = {"up": 0, "down": 0}
        self.sent.append(counts)
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, counts, "up")),
            asyncio.create_task(self._pump(up_reader, writer, counts, "down")),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for w in (writer, up_writer):
            w.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counts: dict[str, int],
        direction: str,
    ) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
            counts[direction] += len(data)
            if direction == self.direction and not self.cut and counts[direction] > self.cut_after:
                if self.before_cut is not None:
                    async with asyncio.timeout(30):
                        while not await self.before_cut():
                            await asyncio.sleep(0.01)
                self.cut = True
                return  # closes both sides of this connection


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(1 << 19, generator=g), "b": torch.randn(64, generator=g)}  # 2 MiB


@contextlib.asynccontextmanager
async def proxied(
    address: str,
    direction: str,
    cut_after: int,
    before_cut: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[CuttingProxy]:
    host, _, port = address.rpartition(":")
    proxy = CuttingProxy((host, int(port)), direction, cut_after, before_cut)
    server = await proxy.start()
    try:
        yield proxy
    finally:
        server.close()


@pytest.fixture
async def weightsync_server(tmp_path: Path, start_weightsync):  # type: ignore[no-untyped-def]
    """The stream transport: the only one that accepts UploadWeights."""
    return await start_weightsync(tmp_path / "weights", transport=StreamTransport())


async def test_cut_upload_resumes_from_the_received_offset(weightsync_server, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="tidal.weights.client")
    sent = weights()
    manifest, files = encode_version(version=0, step=0, state_dict=sent, config={"a": 1})
    size = len(files[WEIGHTS])
    direct = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)

    async def server_holds_bytes() -> bool:  # a loaded server may not have read them yet
        return bool(await direct.upload_progress(manifest))

    async with proxied(weightsync_server.address, "up", size // 2, server_holds_bytes) as proxy:
        client = WeightSyncClient(f"127.0.0.1:{proxy.port}", security=PLAINTEXT_LOOPBACK)
        assert await client.upload(manifest, files, chunk_bytes=1 << 16) == 0
        await client.close()
    assert proxy.cut
    resumes = [r.args for r in caplog.records if "resumes at" in r.getMessage()]
    assert len(resumes) == 1
    _, resumed_at, total = resumes[0]  # type: ignore[misc]
    assert 0 < resumed_at < total == manifest.total_bytes
    # The connections after the cut carried the rest from the resume offset, not it all
    # (64 KiB of slack for HTTP/2 framing, the manifest and the progress query).
    after_cut = sum(c["up"] for c in proxy.sent[1:])
    assert total - resumed_at <= after_cut < total - resumed_at + (1 << 16), (after_cut, resumed_at)
    registered = (await direct.latest()).manifest  # type: ignore[union-attr]
    config, received = decode_version(await direct.fetch_files(registered))
    assert config == {"a": 1}
    assert all(torch.equal(received[k], v) for k, v in sent.items())
    await direct.close()


async def test_cut_fetch_resumes_from_the_received_offset(weightsync_server, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="tidal.weights.client")
    sent = weights()
    manifest, files = encode_version(version=0, step=0, state_dict=sent, config={})
    direct = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    await direct.upload(manifest, files, chunk_bytes=1 << 16)
    registered = (await direct.latest()).manifest  # type: ignore[union-attr]
    size = len(files[WEIGHTS])
    async with proxied(weightsync_server.address, "down", cut_after=size // 2) as proxy:
        client = WeightSyncClient(f"127.0.0.1:{proxy.port}", security=PLAINTEXT_LOOPBACK)
        got = await client.fetch_files(registered)
        await client.close()
    assert proxy.cut
    resumes = [r.args for r in caplog.records if "resumes at" in r.getMessage()]
    assert len(resumes) == 1
    _, resumed_at, total = resumes[0]  # type: ignore[misc]
    assert 0 < resumed_at < total == manifest.total_bytes
    after_cut = sum(c["down"] for c in proxy.sent[1:])
    assert total - resumed_at <= after_cut < total - resumed_at + (1 << 16), (after_cut, resumed_at)
    assert got == files
    await direct.close()


async def test_cut_upload_keeps_progress_a_bad_stream_drops_it(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    manifest, files = encode_version(version=0, step=0, state_dict=weights(), config={})
    data = bytes(files[WEIGHTS])  # encode_version hands out a reusable bytearray
    stub_channel = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    stub = pb_grpc.WeightSyncServiceStub(stub_channel.channel)
    header = pb.UploadWeightsRequest(manifest=manifest_to_proto(manifest))
    half = 8 * (1 << 16)
    hold = asyncio.Event()

    async def first_half() -> AsyncIterator[pb.UploadWeightsRequest]:
        yield header
        for offset in range(0, half, 1 << 16):
            chunk = pb.WeightChunk(
                path=WEIGHTS, offset=offset, data=data[offset : offset + (1 << 16)]
            )
            yield pb.UploadWeightsRequest(chunk=chunk)
        await hold.wait()  # the stream stays open until the test cuts it

    call = stub.UploadWeights(first_half())
    for _ in range(200):
        if (await stub_channel.upload_progress(manifest)).get(WEIGHTS) == half:
            break
        await asyncio.sleep(0.02)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await stub_channel.upload_progress(manifest) == {WEIGHTS: half}
    assert not (weightsync_server.root / "v000000").exists()

    # A stream with a gap is wrong, not cut: refused, and its session is gone.
    gap = pb.WeightChunk(path=WEIGHTS, offset=half + 1, data=b"x")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.UploadWeights(iter([header, pb.UploadWeightsRequest(chunk=gap)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await stub_channel.upload_progress(manifest) == {}
    assert [p.name for p in weightsync_server.root.iterdir()] == []
    await stub_channel.close()


async def test_versions_are_uploaded_and_fetched_through_reused_buffers(weightsync_server) -> None:  # type: ignore[no-untyped-def]
    client = WeightSyncClient(weightsync_server.address, security=PLAINTEXT_LOOPBACK)
    first, second = weights(), {k: v + 1 for k, v in weights().items()}
    manifest, files = encode_version(version=0, step=0, state_dict=first, config={})
    await client.upload(manifest, files, chunk_bytes=1 << 16)
    fetched = await client.fetch_files((await client.latest()).manifest)  # type: ignore[union-attr]
    # The trainer re-encodes into its previous weights file, the replica fetches into its
    # previous buffers: same objects, new bytes, still verified bit for bit.
    manifest, again = encode_version(
        version=1, step=1, state_dict=second, config={}, reuse=files[WEIGHTS]
    )  # type: ignore[arg-type]
    assert again[WEIGHTS] is files[WEIGHTS]
    await client.upload(manifest, again, chunk_bytes=1 << 16)
    refetched = await client.fetch_files((await client.latest()).manifest, reuse=fetched)  # type: ignore[union-attr]
    assert refetched[WEIGHTS] is fetched[WEIGHTS]
    _, received = decode_version(refetched)
    assert all(torch.equal(received[k], v) for k, v in second.items())
    await client.close()
