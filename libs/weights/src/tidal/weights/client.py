"""Async client of the weight-sync service, used by the trainer, inference and the CLI.

`fetch_files` is the receiving half of the stream path: it resumes a broken FetchWeights
stream from the last (file, offset) received, up to `retries` times, and verifies every
sha256 before returning, so a caller never sees unverified bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Mapping

import grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import DiskFull
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.interceptors import reported_kind
from tidal.common.security.transport import TransportSecurity
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.rpc.v1 import weightsync_pb2_grpc as pb_grpc
from tidal.weights.chunk_wire import decode_chunk, encode_upload_chunk
from tidal.weights.manifest import LoadedVersions, VersionEvent, WeightManifest, verify_digests
from tidal.weights.transport_choice import TransportChoice
from tidal.weights.wire import (
    event_from_proto,
    loaded_versions_from_proto,
    manifest_to_proto,
    role_to_proto,
    transport_choice_from_proto,
)

log = logging.getLogger(__name__)
RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
)
# gRPC core reports a connection lost while the client is still sending as INTERNAL
# ("Internal error from Core"). Resuming an upload is always safe (weightsync checks every
# offset and sha256), so uploads retry that too.
UPLOAD_RETRYABLE = (*RETRYABLE, grpc.StatusCode.INTERNAL)
_SERVICE = "/" + pb.DESCRIPTOR.services_by_name["WeightSyncService"].full_name


class WeightSyncClient:
    def __init__(
        self,
        address: str,
        grpc_config: GrpcConfig | None = None,
        *,
        security: TransportSecurity,
    ) -> None:
        self.address = address
        self.channel = make_channel(address, grpc_config, security=security)
        self.stub = pb_grpc.WeightSyncServiceStub(self.channel)
        # The bulk methods' chunks are coded by `chunk_wire` (one copy of each payload).
        self._upload_chunks = self.channel.stream_unary(
            f"{_SERVICE}/UploadWeights", response_deserializer=pb.PublishResponse.FromString
        )
        self._fetch_chunks = self.channel.unary_stream(
            f"{_SERVICE}/FetchWeights",
            request_serializer=pb.FetchWeightsRequest.SerializeToString,
            response_deserializer=decode_chunk,
        )

    async def publish(self, manifest: WeightManifest, *, timeout: float = 120.0) -> int:
        request = pb.PublishRequest(manifest=manifest_to_proto(manifest))
        return (await self.stub.Publish(request, timeout=timeout)).version

    async def latest(self, *, timeout: float = 30.0) -> VersionEvent | None:
        """The newest version, or None when nothing is published yet."""
        try:
            reply = await self.stub.GetVersion(pb.GetVersionRequest(version=-1), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return event_from_proto(reply)

    async def list_versions(self, *, timeout: float = 30.0) -> list[VersionEvent]:
        reply = await self.stub.ListVersions(pb.ListVersionsRequest(), timeout=timeout)
        return [event_from_proto(v) for v in reply.versions]

    async def watch(
        self, replica_id: str, after_version: int = -1, *, loaded_version: int = -1
    ) -> AsyncIterator[VersionEvent]:
        """Versions newer than `after_version`; `loaded_version` (>= 0) tells weightsync
        which version this replica serves, as an acknowledgement would."""
        request = pb.WatchRequest(replica_id=replica_id, after_version=after_version)
        if loaded_version >= 0:
            request.loaded_version = loaded_version
        call = self.stub.Watch(request)
        try:
            async for reply in call:
                yield event_from_proto(reply)
        finally:  # closing the iterator ends the stream, so weightsync's lease runs out
            call.cancel()

    async def watch_loaded(self) -> AsyncIterator[LoadedVersions]:
        """The published version and every replica's loaded version: now, then on change."""
        call = self.stub.WatchLoaded(pb.WatchLoadedRequest())
        try:
            async for reply in call:
                yield loaded_versions_from_proto(reply)
        finally:
            call.cancel()

    async def begin_load(self, replica_id: str, version: int, *, timeout: float = 30.0) -> None:
        request = pb.BeginLoadRequest(replica_id=replica_id, version=version)
        await self.stub.BeginLoad(request, timeout=timeout)

    async def ack_loaded(self, replica_id: str, version: int, *, timeout: float = 30.0) -> None:
        request = pb.AckLoadedRequest(replica_id=replica_id, version=version)
        await self.stub.AckLoaded(request, timeout=timeout)

    async def join_sync(
        self,
        member_id: str,
        role: str,
        *,
        store_address: str = "",
        after_generation: int = 0,
        timeout: float = 300.0,
    ) -> TransportChoice:
        """The run's data path; for broadcast, this member's seat (a replica waits for the
        trainer to join, or to re-form the group after `after_generation` broke)."""
        request = pb.JoinSyncRequest(
            member_id=member_id,
            role=role_to_proto(role),
            store_address=store_address,
            after_generation=after_generation,
        )
        return transport_choice_from_proto(await self.stub.JoinSync(request, timeout=timeout))

    async def upload_progress(
        self, manifest: WeightManifest, *, timeout: float = 30.0
    ) -> dict[str, int]:
        """Bytes per file that weightsync holds of a cut upload of `manifest` ({} if none)."""
        request = pb.GetUploadProgressRequest(manifest=manifest_to_proto(manifest))
        reply = await self.stub.GetUploadProgress(request, timeout=timeout)
        return {f.path: f.received for f in reply.files}

    async def upload(
        self,
        manifest: WeightManifest,
        files: Mapping[str, bytes | bytearray],
        *,
        chunk_bytes: int,
        retries: int = 3,
        timeout: float = 600.0,
    ) -> int:
        """Publish a version by streaming its files; returns the registered version.

        Each attempt first asks how much of this manifest weightsync already holds (a cut
        earlier attempt, even by another process) and sends only the rest; a stream
        broken by a retryable status is resumed that way up to `retries` times. A full
        disk at weightsync raises `DiskFull` (no retry: it would fail alike).
        """
        attempt = 0
        while True:
            progress = await self.upload_progress(manifest)
            if progress:
                log.info(
                    "upload of version %d resumes at %d of %d bytes",
                    manifest.version,
                    sum(progress.values()),
                    manifest.total_bytes,
                )
            requests = _upload_requests(manifest, files, chunk_bytes, progress)
            try:
                return (await self._upload_chunks(requests, timeout=timeout)).version
            except grpc.aio.AioRpcError as exc:
                if reported_kind(exc) == DiskFull.__name__:  # a retry would fail alike
                    where = f"weightsync at {self.address}"
                    raise DiskFull.reported(where, exc.details() or "") from None
                attempt += 1
                if exc.code() not in UPLOAD_RETRYABLE or attempt > retries:
                    raise
                log.warning(
                    "upload of version %d broke (%s); resuming", manifest.version, exc.code().name
                )
                await asyncio.sleep(0.05 * attempt)

    async def fetch_files(
        self,
        manifest: WeightManifest,
        *,
        retries: int = 3,
        timeout: float = 600.0,
        reuse: Mapping[str, bytearray] | None = None,
    ) -> dict[str, bytearray]:
        """Every file of a version, streamed in chunks, resumed on a broken stream, verified.

        Each file lands in a buffer of its final size (no regrowing, no copy at the end):
        the buffer of the same name in `reuse` (an earlier fetch's result the caller is
        done with) when its size matches, so its pages are not faulted in again;
        each chunk is hashed in a worker thread while the next one is received, so
        verifying costs no extra pass over the bytes. A broken stream resumes at the
        first byte not yet received.
        """
        reuse = reuse or {}
        buffers = {
            f.path: reuse[f.path]
            if f.path in reuse and len(reuse[f.path]) == f.size
            else bytearray(f.size)
            for f in manifest.files
        }
        received = {f.path: 0 for f in manifest.files}
        digests = {f.path: hashlib.sha256() for f in manifest.files}
        hashing: asyncio.Future[None] | None = None  # hash of the previous chunk
        attempt = 0
        while pending := [f.path for f in manifest.files if received[f.path] < f.size]:
            path, offset = pending[0], received[pending[0]]
            if attempt:
                log.info(
                    "fetch of version %d resumes at %d of %d bytes",
                    manifest.version,
                    sum(received.values()),
                    manifest.total_bytes,
                )
            request = pb.FetchWeightsRequest(version=manifest.version, path=path, offset=offset)
            try:
                async for chunk in self._fetch_chunks(request, timeout=timeout):
                    start = received.get(chunk.path)
                    if start is None:
                        raise ValueError(f"chunk of {chunk.path!r}, which is not in the manifest")
                    stop = start + len(chunk.data)
                    if chunk.offset != start or stop > len(buffers[chunk.path]):
                        raise ValueError(
                            f"{chunk.path}: chunk of {len(chunk.data)} bytes at offset "
                            f"{chunk.offset}, expected offset {start} and at most "
                            f"{len(buffers[chunk.path])} bytes in all"
                        )
                    memoryview(buffers[chunk.path])[start:stop] = chunk.data
                    received[chunk.path] = stop
                    if hashing is not None:
                        await hashing  # updates of one digest must stay in order
                    hashing = asyncio.ensure_future(
                        asyncio.to_thread(digests[chunk.path].update, chunk.data)
                    )
                break
            except grpc.aio.AioRpcError as exc:
                attempt += 1
                if exc.code() not in RETRYABLE or attempt > retries:
                    raise
                log.warning(
                    "fetch of version %d broke (%s); resuming", manifest.version, exc.code().name
                )
            finally:
                if hashing is not None:
                    await hashing
                    hashing = None
        verify_digests(manifest, {p: (received[p], d.hexdigest()) for p, d in digests.items()})
        return buffers

    async def close(self) -> None:
        await self.channel.close()


async def _upload_requests(
    manifest: WeightManifest,
    files: Mapping[str, bytes | bytearray],
    chunk_bytes: int,
    progress: Mapping[str, int],
) -> AsyncIterator[bytes]:
    """The serialized manifest, then every file's chunks from its resume offset on."""
    yield pb.UploadWeightsRequest(manifest=manifest_to_proto(manifest)).SerializeToString()
    for f in manifest.files:
        data = memoryview(files[f.path])
        # A file received whole sends nothing: its digest is complete on weightsync.
        for offset in range(progress.get(f.path, 0), len(data), chunk_bytes):
            yield encode_upload_chunk(f.path, offset, data[offset : offset + chunk_bytes])
