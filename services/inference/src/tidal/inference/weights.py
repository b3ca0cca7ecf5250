"""The weight watcher: follow weight-sync's versions and hot-load each into the engine.

Decisions:
- One long-lived `Watch` stream (which also registers this replica); each event is read
  from the shared filesystem with `load_version`, which verifies every sha256 first, in
  a worker thread so the event loop keeps serving. Then the engine swaps the weights in
  between decode steps, and only after it serves them do we `AckLoaded`, so weight-sync's
  `loaded_by` means "serving", not "downloaded". A failed ack (after the channel's own
  retries) is logged, not fatal: the replica serves the version either way.
- A version that fails verification or does not fit the model is logged and skipped;
  the engine keeps serving the previous one, and the next version is tried normally.
- Each load is a span whose parent is the publish span carried in the event, so a
  replica's load appears inside the training step's trace.
- A broken stream (weight-sync restarting) is reopened after an exponential backoff,
  resuming after the newest version seen, so nothing is loaded twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from opentelemetry import trace

from tidal.common.telemetry import extract_carrier
from tidal.inference.engine import Engine
from tidal.weightsync.client import WeightSyncClient
from tidal.weightsync.filesystem import load_version
from tidal.weightsync.manifest import CorruptWeights, VersionEvent

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0


class WeightWatcher:
    def __init__(
        self,
        client: WeightSyncClient,
        engine: Engine,
        replica_id: str,
        *,
        on_loaded: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        self.engine = engine
        self.replica_id = replica_id
        self.on_loaded = on_loaded
        self.seen = -1  # newest version received (loaded or skipped)
        self.skipped: list[int] = []

    async def run(self) -> None:
        """Watch forever, reconnecting with backoff; cancel the task to stop."""
        backoff = BACKOFF_START_S
        while True:
            try:
                async for event in self.client.watch(self.replica_id, after_version=self.seen):
                    backoff = BACKOFF_START_S
                    await self.load(event)
                log.warning("weight-sync closed the watch stream; reconnecting")
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "watch stream broke (%s: %s); reconnecting in %.1fs",
                    exc.code().name,
                    exc.details(),
                    backoff,
                )
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, BACKOFF_MAX_S)

    async def load(self, event: VersionEvent) -> bool:
        """Load one version into the engine and acknowledge it; False when skipped."""
        manifest = event.manifest
        self.seen = max(self.seen, manifest.version)
        context = extract_carrier(event.trace_context)
        with tracer.start_as_current_span("inference.load_weights", context=context) as span:
            span.set_attributes(
                {
                    "weights.version": manifest.version,
                    "weights.step": manifest.step,
                    "weights.bytes": manifest.total_bytes,
                    "replica.id": self.replica_id,
                }
            )
            started = time.perf_counter()
            try:
                hf_config, state_dict = await asyncio.to_thread(load_version, manifest)
                await self.engine.update_weights(manifest.version, hf_config, state_dict)
            except (CorruptWeights, ValueError, OSError) as exc:
                log.error("skipping version %d: %s", manifest.version, exc)
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                self.skipped.append(manifest.version)
                return False
            seconds = time.perf_counter() - started
            span.set_attribute("weights.load_s", seconds)
            log.info(
                "loaded version %d (step %d) in %.3fs", manifest.version, manifest.step, seconds
            )
            try:
                await self.client.ack_loaded(self.replica_id, manifest.version)
            except grpc.aio.AioRpcError as exc:  # already retried by the channel's policy
                log.warning("could not acknowledge version %d: %s", manifest.version, exc.details())
        if self.on_loaded is not None:
            await self.on_loaded(manifest.version)
        return True
