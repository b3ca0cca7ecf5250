"""Run the weight-sync service: `tidal weightsync @ cfg.toml` or `python -m tidal.weightsync`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.observability.prometheus import ServiceMetrics
from tidal.common.observability.tracing import setup_telemetry
from tidal.common.process.service_start import settle_startup_heap, start_service
from tidal.common.security.transport import for_service
from tidal.weightsync.config import WeightSyncRunConfig
from tidal.weightsync.leases import Leases
from tidal.weightsync.prometheus import WeightSyncMetrics
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

log = logging.getLogger(__name__)
FULL_NAME = "tidal.rpc.v1.WeightSyncService"


async def serve(config: WeightSyncRunConfig) -> None:
    provider = setup_telemetry("weightsync", config.telemetry, config.run.dir)
    config.weights_root.mkdir(parents=True, exist_ok=True)
    # Verifies every version already on disk before the server listens (recovery.py).
    registry = VersionRegistry(
        config.weights_root,
        config.weightsync.keep_last,
        leases=Leases(config.weightsync.lease_s),
    )
    metrics = ServiceMetrics("weightsync", config.metrics)
    servicer = WeightSyncServicer(
        registry,
        chunk_bytes=config.weightsync.chunk_bytes,
        transport=config.weightsync.transport,
        metrics=WeightSyncMetrics.on(metrics, registry),
        grpc_config=config.grpc,
    )
    binding = ServiceBinding(servicer, add_to_server, FULL_NAME)
    address = config.grpc.listen_address(config.endpoints.weightsync)
    security = for_service(config, "weightsync")
    server = GrpcServer(address, [binding], config.grpc, security=security, metrics=metrics)
    server.add_shutdown_hook(servicer.end_streams)
    await server.start()
    log.info(
        "serving on %s, root %s, transport %s",
        config.endpoints.weightsync,
        config.weights_root,
        config.weightsync.transport.type,
    )
    await server.serve_forever()
    provider.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    config = start_service(WeightSyncRunConfig, "weightsync", argv)
    settle_startup_heap()
    asyncio.run(serve(config))
