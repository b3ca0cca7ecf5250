"""Async client of the weight-sync service, used by the trainer, inference and the CLI."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tidal.common.channel import make_channel
from tidal.common.sections import GrpcConfig
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.rpc.v1 import weightsync_pb2_grpc as pb_grpc
from tidal.weightsync.convert import event_from_proto, manifest_to_proto
from tidal.weightsync.manifest import VersionEvent, WeightManifest


class WeightSyncClient:
    def __init__(self, address: str, grpc_config: GrpcConfig | None = None) -> None:
        self.channel = make_channel(address, grpc_config)
        self.stub = pb_grpc.WeightSyncServiceStub(self.channel)

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

    async def watch(self, replica_id: str, after_version: int = -1) -> AsyncIterator[VersionEvent]:
        call = self.stub.Watch(pb.WatchRequest(replica_id=replica_id, after_version=after_version))
        async for reply in call:
            yield event_from_proto(reply)

    async def ack_loaded(self, replica_id: str, version: int, *, timeout: float = 30.0) -> None:
        request = pb.AckLoadedRequest(replica_id=replica_id, version=version)
        await self.stub.AckLoaded(request, timeout=timeout)

    async def close(self) -> None:
        await self.channel.close()
