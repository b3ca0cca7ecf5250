"""The weight reloader: watch weight-sync's versions and hot-load each into the engine.

`JoinSync` gives the run's data path and `make_receiver` its receiver; one long-lived
`Watch` stream announces every version, which the receiver fetches and verifies. This
module keeps the version policy: loads are serialized and never go backwards, so a
version arriving by both paths (a broadcast push and its Watch event) loads once;
`BeginLoad` pins a version's files, and `AckLoaded` follows once the engine serves it. A
version that fails to verify or fit is logged and skipped (a fresh replica falls back to
older versions); LoRA adapter versions are merged onto their base first (`adapters`). A
broken stream is reopened after a backoff, resuming after the newest version seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import torch
from opentelemetry import trace

from tidal.common.observability.tracing import extract_carrier
from tidal.inference.adapters import AdapterMerger, adapter_spec, check_described
from tidal.inference.engine import Engine
from tidal.inference.prometheus import InferenceMetrics
from tidal.weights.client import WeightSyncClient
from tidal.weights.manifest import CorruptWeights, VersionEvent, WeightManifest
from tidal.weights.transport_choice import TransportChoice
from tidal.weights.transports.base import ReceivedVersion, WeightReceiver
from tidal.weights.transports.factory import make_receiver
from tidal.weights.transports.filesystem import FilesystemReceiver

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
JOIN_TIMEOUT_S = 300.0


class WeightWatcher:
    def __init__(
        self,
        client: WeightSyncClient,
        engine: Engine,
        replica_id: str,
        *,
        on_loaded: Callable[[int], Awaitable[None]] | None = None,
        metrics: InferenceMetrics | None = None,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.engine = engine
        self.replica_id = replica_id
        self.on_loaded = on_loaded
        self.choice: TransportChoice | None = None
        self.seen = -1  # newest version announced by Watch (loaded or skipped)
        self.loaded = -1  # newest version the engine serves
        self.acked = -1
        self.skipped: list[int] = []
        self.received_by_broadcast: list[int] = []
        self.receiver: WeightReceiver = FilesystemReceiver()  # until JoinSync says
        self._lock = asyncio.Lock()
        self._receiving: asyncio.Task[None] | None = None  # pushed versions (broadcast)
        self.adapters = AdapterMerger()  # the base that LoRA adapters merge onto
        self._timed_any = False  # a load was timed (the first measures start-up)

    async def run(self) -> None:
        """Join, then watch forever, reconnecting with backoff; cancel the task to stop."""
        try:
            await self._watch_forever()
        finally:
            if self._receiving is not None:
                self._receiving.cancel()

    async def _watch_forever(self) -> None:
        backoff = BACKOFF_START_S
        while True:
            try:
                if self.choice is None:
                    self._start_receiver(
                        await self.client.join_sync(
                            self.replica_id, "replica", timeout=JOIN_TIMEOUT_S
                        )
                    )
                if self.seen < 0:  # a fresh replica starts from the newest version
                    latest = await self.client.latest()
                    if latest is not None:
                        self.seen = latest.manifest.version - 1
                # Says what this replica serves: a restarted weightsync learns it again.
                stream = self.client.watch(
                    self.replica_id, after_version=self.seen, loaded_version=self.loaded
                )
                async for event in stream:
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
            except Exception:  # unforeseen: keep following versions rather than die silently
                log.exception("weight watcher failed; retrying in %.1fs", backoff)
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, BACKOFF_MAX_S)

    def _start_receiver(self, choice: TransportChoice) -> None:
        self.receiver = make_receiver(choice, client=self.client, replica_id=self.replica_id)
        self.choice = choice
        self._receiving = asyncio.create_task(
            self.receiver.run(self._install_received), name="weights-receiver"
        )

    async def _install_received(self, received: ReceivedVersion) -> None:
        self.received_by_broadcast.append(received.version)
        context = extract_carrier(received.trace_context)
        with tracer.start_as_current_span("inference.load_weights", context=context) as span:
            span.set_attributes(
                {
                    "weights.version": received.version,
                    "weights.step": received.step,
                    "weights.path": "broadcast",
                    "replica.id": self.replica_id,
                }
            )
            started = time.perf_counter()
            try:
                installed = await self._install(
                    received.version,
                    received.step,
                    received.hf_config,
                    received.state_dict,
                    source="broadcast",
                )
                if installed and self.metrics is not None:  # received already: install only
                    seconds = time.perf_counter() - started
                    self.metrics.loaded("broadcast", seconds, 0, first=not self._timed_any)
                    self._timed_any = True
            except ValueError as exc:
                log.error("skipping broadcast version %d: %s", received.version, exc)
                span.record_exception(exc)
                self.skipped.append(received.version)

    async def load(self, event: VersionEvent) -> bool:
        """Load one announced version into the engine and acknowledge it; False when skipped.

        A replica that serves nothing yet and cannot load it falls back to the older
        versions weight-sync still holds, newest first, until one loads."""
        if await self._load_one(event):
            return True
        if self.loaded < 0:
            await self._fall_back(before=event.manifest.version)
        return False

    async def _fall_back(self, *, before: int) -> None:
        """Load the newest version older than `before` that verifies and fits."""
        try:
            events = await self.client.list_versions()
        except grpc.aio.AioRpcError as exc:
            log.warning("cannot list older versions to fall back to: %s", exc.details())
            return
        older = sorted(
            (
                e
                for e in events
                if e.manifest.version < before and e.manifest.version not in self.skipped
            ),
            key=lambda e: e.manifest.version,
            reverse=True,
        )
        for event in older:
            log.warning(
                "no version served yet and version %d failed; trying older version %d",
                before,
                event.manifest.version,
            )
            if await self._load_one(event):
                return
        log.error("no version older than %d loads either; waiting for a new one", before)

    async def _load_one(self, event: VersionEvent) -> bool:
        """Load one version into the engine and acknowledge it; False when skipped."""
        manifest = event.manifest
        self.seen = max(self.seen, manifest.version)
        if self.loaded >= manifest.version:  # it came by broadcast already
            await self._ack(manifest.version)
            return True
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
            if not await self._begin_load(manifest.version):
                return False
            try:
                hf_config, state_dict = await self._fetch(manifest, reuse=True)
                check_described(manifest, hf_config)
                installed = await self._install(
                    manifest.version,
                    manifest.step,
                    hf_config,
                    state_dict,
                    source=self.receiver.source,
                )
            except (CorruptWeights, ValueError, OSError) as exc:
                log.error("skipping version %d: %s", manifest.version, exc)
                return self._skip(manifest.version, exc, span)
            except Exception as exc:  # e.g. a config.json missing a key: never the task's end
                log.exception("skipping version %d: unexpected failure", manifest.version)
                return self._skip(manifest.version, exc, span)
            seconds = time.perf_counter() - started
            span.set_attribute("weights.load_s", seconds)
        if installed and self.metrics is not None:
            first = not self._timed_any
            self.metrics.loaded(self.receiver.source, seconds, event.published_unix_ms, first=first)
            self._timed_any = True
        if not installed:  # a broadcast of this version won the race
            await self._ack(manifest.version)
        return True

    def _skip(self, version: int, exc: BaseException, span: trace.Span) -> bool:
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        self.skipped.append(version)
        return False

    async def _begin_load(self, version: int) -> bool:
        """Ask weight-sync to keep the version's files while we read them; False if gone."""
        try:
            await self.client.begin_load(self.replica_id, version)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                log.info("version %d was superseded and removed before loading it", version)
                self.skipped.append(version)
                return False
            log.warning("could not announce loading version %d: %s", version, exc.details())
        return True

    async def _fetch(
        self, manifest: WeightManifest, *, reuse: bool = False
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(config, state) of a version. With `reuse` (a version installed, i.e. copied,
        before the next is fetched) the receiver may reuse the previous fetch's buffers; a
        LoRA base, kept as it is, gets its own."""
        return await self.receiver.fetch(manifest, reuse=reuse)

    async def _install(
        self,
        version: int,
        step: int,
        hf_config: dict[str, Any],
        state: dict[str, torch.Tensor],
        *,
        source: str,
    ) -> bool:
        """Hand the weights to the engine unless it already serves this or a newer version."""
        started = time.perf_counter()
        async with self._lock:
            if self.loaded >= version:
                return False
            hf_config, state = await self._apply_adapters(version, hf_config, state)
            await self.engine.update_weights(version, hf_config, state)
            self.loaded = version
        seconds = time.perf_counter() - started
        log.info("loaded version %d (step %d) by %s in %.3fs", version, step, source, seconds)
        if self.seen >= version:  # registered already: weight-sync can record it
            await self._ack(version)
        if self.on_loaded is not None:
            await self.on_loaded(version)
        return True

    async def _apply_adapters(
        self, version: int, hf_config: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Full weights of `version`: LoRA adapters merged onto their base, else as given."""
        spec = adapter_spec(hf_config)
        if spec is None:
            return hf_config, state
        if not self.adapters.holds(spec.base_version):
            base_config, base_state = await self._fetch_base(version, spec.base_version)
            self.adapters.keep_base(spec.base_version, base_config, base_state)
        return await asyncio.to_thread(self.adapters.merge, version, hf_config, state)

    async def _fetch_base(
        self, version: int, base: int
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The full weights of `base` (the version adapters of `version` apply to)."""
        try:
            events = {e.manifest.version: e for e in await self.client.list_versions()}
            if base not in events:
                raise ValueError(f"weight-sync does not hold it (it holds {sorted(events)})")
            log.info("fetching base version %d for the adapters of version %d", base, version)
            hf_config, state = await self._fetch(events[base].manifest)
            check_described(events[base].manifest, hf_config)
        except (grpc.aio.AioRpcError, CorruptWeights, OSError, ValueError) as exc:
            raise ValueError(
                f"adapters of version {version} apply to base version {base}, which could not "
                f"be loaded: {exc}"
            ) from exc
        return hf_config, state

    async def _ack(self, version: int) -> None:
        if version <= self.acked:
            return
        try:
            await self.client.ack_loaded(self.replica_id, version)
        except grpc.aio.AioRpcError as exc:  # already retried by the channel's policy
            log.warning("could not acknowledge version %d: %s", version, exc.details())
        # Only once the call has returned: `acked` said "acknowledged" while the RPC was
        # still in flight, so a caller that stopped on it could cut the acknowledgement.
        self.acked = max(self.acked, version)
