"""WeightSyncService: proto ⇄ registry. Errors are raised; the interceptor maps them.

Every field a caller sets is checked here or in the registry and refused
INVALID_ARGUMENT naming it (FetchWeights' `offset` against the file's size from the
manifest, before any file is opened); UploadWeights only when the stream transport is
in use (FAILED_PRECONDITION otherwise), and one whose manifest's files add up to more than
`weightsync.transport.max_upload_bytes` RESOURCE_EXHAUSTED before a byte is written; every
message is at most `grpc.max_request_bytes` (the server's receive limit) and an upload
chunk's data at most that less 64 KiB (`tidal.common.grpc.limits`). The chunks of
FetchWeights and UploadWeights cross as bytes coded by `chunk_wire` (`add_to_server`
registers them so), not as messages. At shutdown `end_streams` ends the Watch and
WatchLoaded streams cleanly, so open watchers never hold the server for its grace."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from tidal.common.grpc.limits import check_chunk_size
from tidal.common.observability.tracing import inject_carrier
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.rpc.v1 import weightsync_pb2_grpc as pb_grpc
from tidal.weights.chunk_wire import decode_chunk, encode_chunk, upload_item
from tidal.weights.manifest import WeightManifest
from tidal.weights.transport_choice import TransportChoice
from tidal.weights.wire import (
    event_to_proto,
    loaded_versions_to_proto,
    manifest_from_proto,
    role_from_proto,
    transport_choice_to_proto,
)
from tidal.weightsync.config import (
    BroadcastTransport,
    FilesystemTransport,
    StreamTransport,
    Transport,
)
from tidal.weightsync.file_chunks import FileChunks
from tidal.weightsync.prometheus import WeightSyncMetrics
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.rendezvous import BroadcastRendezvous
from tidal.weightsync.upload import UploadChunk, UploadReceiver

T = TypeVar("T")


class WeightSyncServicer(pb_grpc.WeightSyncServiceServicer):
    def __init__(
        self,
        registry: VersionRegistry,
        *,
        chunk_bytes: int,
        transport: Transport | None = None,
        metrics: WeightSyncMetrics | None = None,
        grpc_config: GrpcConfig | None = None,
    ) -> None:
        self.registry = registry
        self.grpc_config = grpc_config or GrpcConfig()
        self.metrics = metrics
        self.chunk_bytes = chunk_bytes
        self.transport = transport or FilesystemTransport()
        self.uploads = UploadReceiver(registry.root)
        if isinstance(self.transport, StreamTransport):
            registry.recycle = self.uploads.recycle
        self.rendezvous = (
            BroadcastRendezvous(self.transport)
            if isinstance(self.transport, BroadcastTransport)
            else None
        )
        self._closing = asyncio.Event()
        """Set when the server shuts down: the Watch and WatchLoaded streams end then."""

    def end_streams(self) -> None:
        """End every Watch and WatchLoaded stream (the server is shutting down)."""
        self._closing.set()

    async def _unless_closing(self, waiting: Coroutine[Any, Any, T]) -> T | None:
        """What `waiting` returns, or None once the server is shutting down."""
        done = asyncio.ensure_future(waiting)
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((done, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the caller is cancelled: neither waiter outlives the call
            done.cancel()
            closing.cancel()
        return done.result() if done.done() and not done.cancelled() else None

    async def Publish(
        self, request: pb.PublishRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishResponse:
        manifest = manifest_from_proto(request.manifest)
        self.registry.check_location(Path(manifest.location), manifest.version)
        # The publish span is the parent of every replica's load of this version.
        before = self.registry.newest
        await self.registry.publish(manifest, inject_carrier())
        self._count_published(before)
        return pb.PublishResponse(version=manifest.version)

    def _count_published(self, newest_before: int) -> None:
        if self.metrics is not None and self.registry.newest > newest_before:
            self.metrics.published.inc()

    async def GetVersion(
        self, request: pb.GetVersionRequest, context: grpc.aio.ServicerContext
    ) -> pb.WeightVersion:
        return event_to_proto(self.registry.get(request.version))

    async def ListVersions(
        self, request: pb.ListVersionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListVersionsResponse:
        return pb.ListVersionsResponse(versions=[event_to_proto(e) for e in self.registry.all()])

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WeightVersion]:
        if request.after_version < -1:
            raise InvalidArgument("after_version", f"must be >= -1, got {request.after_version}")
        loaded = request.loaded_version if request.HasField("loaded_version") else None
        self.registry.watch_opened(request.replica_id, loaded)
        try:
            after = request.after_version
            while True:
                events = await self._unless_closing(self.registry.wait_newer(after))
                if events is None:
                    return
                for event in events:
                    yield event_to_proto(event)
                    after = event.manifest.version
        finally:  # the replica's lease now runs out unless it reconnects (leases.py)
            self.registry.watch_closed(request.replica_id)

    async def WatchLoaded(
        self, request: pb.WatchLoadedRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LoadedVersions]:
        revision = -1
        while True:  # whole states, so changes that come in a burst are sent as one
            changed = await self._unless_closing(self.registry.wait_changed(revision))
            if changed is None:
                return
            revision = changed
            yield loaded_versions_to_proto(self.registry.loaded_versions())

    async def BeginLoad(
        self, request: pb.BeginLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.BeginLoadResponse:
        self.registry.begin_load(request.replica_id, request.version)
        return pb.BeginLoadResponse()

    async def AckLoaded(
        self, request: pb.AckLoadedRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckLoadedResponse:
        self.registry.ack(request.replica_id, request.version)
        return pb.AckLoadedResponse()

    async def FetchWeights(
        self, request: pb.FetchWeightsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        manifest = self.registry.get(request.version).manifest
        names = [f.path for f in manifest.files]
        if request.path and request.path not in names:
            raise InvalidArgument("path", f"{request.path!r} is not in version {manifest.version}")
        if request.offset < 0:
            raise InvalidArgument("offset", f"must be >= 0, got {request.offset}")
        start = names.index(request.path) if request.path else 0
        first = manifest.files[start]
        if request.offset > first.size:  # checked here: a seek past the end would read nothing
            raise InvalidArgument(
                "offset", f"{request.offset} is beyond {first.path} ({first.size} bytes)"
            )
        for i, name in enumerate(names[start:]):
            offset = request.offset if i == 0 else 0
            # Opening and reading run in a worker thread: a slow disk (or a network
            # filesystem) must not stall every other RPC this server answers.
            async with FileChunks(Path(manifest.location) / name, offset, self.chunk_bytes) as f:
                async for data in f:
                    yield encode_chunk(name, offset, data)
                    offset += len(data)
                    if self.metrics is not None:
                        self.metrics.fetched_bytes.inc(len(data))

    async def UploadWeights(
        self,
        request_iterator: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
    ) -> pb.PublishResponse:
        if not isinstance(self.transport, StreamTransport):
            # Only the stream path writes versions through this service; elsewhere an upload
            # is no publisher's doing, so it is refused before a byte is read.
            raise FailedPrecondition(
                'UploadWeights is accepted only when weightsync.transport.type is "stream"; '
                f"this service uses {self.transport.type!r}: publish with Publish"
            )
        first = await anext(aiter(request_iterator), None)
        item, body = upload_item(first) if first is not None else ("", b"")
        if item != "manifest":
            raise InvalidArgument("item", "the first UploadWeights message must be the manifest")
        header = pb.WeightManifest.FromString(bytes(body))
        header.location = header.location or "(uploaded)"  # weightsync decides where
        manifest = manifest_from_proto(header)
        self.registry.check_newer(manifest.version)
        self.registry.check_base(manifest)
        check_upload_size(manifest, self.transport.max_upload_bytes)

        async def chunks() -> AsyncIterator[UploadChunk]:
            async for message in request_iterator:
                item, body = upload_item(message)
                if item != "chunk":
                    raise InvalidArgument("item", "only the first message may be a manifest")
                c = decode_chunk(body)
                check_chunk_size("chunk.data", len(c.data), self.grpc_config)
                yield UploadChunk(c.path, c.offset, c.data)

        async def register(published: WeightManifest) -> None:
            await self.registry.publish(published, inject_carrier(), verified=True)

        started, before = time.perf_counter(), self.registry.newest
        published = await self.uploads.receive(manifest, chunks(), register)
        if self.metrics is not None:
            self.metrics.upload_seconds.observe(time.perf_counter() - started)
        self._count_published(before)
        return pb.PublishResponse(version=published.version)

    async def GetUploadProgress(
        self, request: pb.GetUploadProgressRequest, context: grpc.aio.ServicerContext
    ) -> pb.UploadProgress:
        header = pb.WeightManifest()
        header.CopyFrom(request.manifest)
        header.location = header.location or "(uploaded)"
        progress = self.uploads.progress(manifest_from_proto(header))
        return pb.UploadProgress(
            files=[pb.FileProgress(path=p, received=n) for p, n in progress.items()]
        )

    async def JoinSync(
        self, request: pb.JoinSyncRequest, context: grpc.aio.ServicerContext
    ) -> pb.SyncPlan:
        role = role_from_proto(request.role)
        choice = TransportChoice(self.transport.type, self.chunk_bytes)
        if self.rendezvous is None or (role == "trainer" and not request.store_address):
            return transport_choice_to_proto(
                choice
            )  # the transport only: the trainer has no store yet
        if role == "trainer":
            seat = await self.rendezvous.join_trainer(request.store_address)
        else:
            if request.store_address:
                raise FailedPrecondition("only the trainer may offer a store_address")
            seat = await self.rendezvous.join_replica(request.member_id, request.after_generation)
        return transport_choice_to_proto(
            TransportChoice(choice.transport, choice.chunk_bytes, seat)
        )


def check_upload_size(manifest: WeightManifest, max_upload_bytes: int) -> None:
    """Refuse an upload whose files add up to more than the cap, before anything is written."""
    total = sum(f.size for f in manifest.files)
    if total > max_upload_bytes:
        raise ResourceExhausted(
            f"manifest.files: version {manifest.version} would upload {total} bytes, more "
            f"than weightsync.transport.max_upload_bytes ({max_upload_bytes})"
        )


def add_to_server(servicer: WeightSyncServicer, server: grpc.aio.Server) -> None:
    """Register `servicer` as the generated code does, except that the chunk-carrying
    sides of FetchWeights and UploadWeights are plain bytes (`chunk_wire`)."""
    pb_grpc.add_WeightSyncServiceServicer_to_server(servicer, _BytesChunks(server))


class _BytesChunks:
    """The server as the generated registration sees it: it swaps in the bulk methods'
    byte handlers and registers every handler both ways (registered, then generic)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # rebuilt from the registered handlers below, so both ways agree

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        fetch, upload = handlers["FetchWeights"], handlers["UploadWeights"]
        swapped = {
            **handlers,
            "FetchWeights": grpc.unary_stream_rpc_method_handler(
                fetch.unary_stream, request_deserializer=fetch.request_deserializer
            ),
            "UploadWeights": grpc.stream_unary_rpc_method_handler(
                upload.stream_unary, response_serializer=upload.response_serializer
            ),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, swapped),)
        )
        self.server.add_registered_method_handlers(service, swapped)
