"""Several inference replicas behind one client: least outstanding work, retry, ride-out.

The pool has the client interface the rest of the orchestrator uses, so one replica is
the case N = 1. A call (Generate or Score) goes to the replica that last took its affinity
key, else to a serving replica whose pushed occupancy is within the in-flight targets,
the one with the fewest requested tokens in flight; it is retried whole on another when
its replica is lost, and waits up to `recovery.peer_loss_s` while none serves. Health
probes bring a lost replica back. Each replica pushes its queue and KV-cache use
(occupancy.py); the pool hands the worst of them to `on_pressure` (the in-flight bound).
The version gate is the oldest version the serving replicas have loaded, as weightsync
pushes it (version_feed.py). docs/orchestrator.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.security.transport import TransportSecurity
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import InflightConfig
from tidal.orchestrator.peers.inference_client import InferenceClient, ReplicaOccupancy
from tidal.orchestrator.peers.occupancy import follow_occupancy, fresh
from tidal.orchestrator.peers.peer_client import PeerError
from tidal.orchestrator.peers.replica import Replica
from tidal.orchestrator.peers.version_feed import VersionFeed

log = logging.getLogger(__name__)
T = TypeVar("T")
LOST_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED}
)
"""A replica failing a call with one of these is treated as gone until its health returns."""
BUSY_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
"""Retried on the least loaded replica after BUSY_BACKOFF_S, without marking it lost."""
BUSY_BACKOFF_S = 0.2
PROBE_S = 0.5
PROBE_TIMEOUT_S = 2.0
PROBE_MISSES = 2
AFFINITY_KEYS = 4096
STATUS_TIMEOUT_S = 5.0


class InferencePool:
    def __init__(
        self,
        addresses: Sequence[str],
        grpc_config: GrpcConfig | None = None,
        *,
        security: TransportSecurity,
        lost_timeout_s: float = 300.0,
        probe_s: float = PROBE_S,
        versions: VersionFeed | None = None,
        inflight: InflightConfig | None = None,
        on_pressure: Callable[[int, float], Awaitable[None]] | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("an inference pool needs at least one replica address")
        self.replicas = [
            Replica(i, InferenceClient(a, grpc_config, security=security))
            for i, a in enumerate(addresses)
        ]
        self.lost_timeout_s = lost_timeout_s
        self.probe_s = probe_s
        self.versions = versions or VersionFeed()
        """What weightsync pushes: the version each replica has loaded."""
        self.inflight = inflight or InflightConfig()
        """The queue and KV-cache targets past which a replica is routed to last."""
        self.on_pressure = on_pressure
        """Called with `pressure()` after each report while some replica has reported."""
        self._changed = asyncio.Condition()
        self._probes: list[asyncio.Task[None]] = []
        self._waiting_logged = False
        self._affinity: OrderedDict[str, int] = OrderedDict()
        """Affinity key → index of the replica it was last sent to (LRU order)."""

    @property
    def addresses(self) -> list[str]:
        return [r.address for r in self.replicas]

    @property
    def max_seq_len(self) -> int | None:
        """The smallest context length the replicas reported (None before any did): a
        multi-turn episode's context must fit whichever replica serves its next turn."""
        known = [r.max_seq_len for r in self.replicas if r.max_seq_len > 0]
        return min(known, default=None)

    # ---- start-up and health -----------------------------------------------------------

    async def wait_serving(self, timeout: float) -> None:
        """Wait (at start-up) until every replica is SERVING, then start the probes."""
        await asyncio.gather(*(r.client.wait_serving(timeout) for r in self.replicas))
        for replica in self.replicas:
            replica.read_info(await replica.client.info(timeout=STATUS_TIMEOUT_S))
        self.versions.changed()
        self.start_probes()

    def start_probes(self) -> None:
        """Start each replica's health probe and its occupancy stream."""
        if not self._probes:
            self._probes = [asyncio.create_task(self._probe(r)) for r in self.replicas]
            self._probes += [asyncio.create_task(self._watch(r)) for r in self.replicas]

    async def _watch(self, replica: Replica) -> None:
        async def report(occupancy: ReplicaOccupancy | None) -> None:
            pushed_id = occupancy.replica_id if occupancy is not None else ""
            if replica.replica_id and pushed_id not in ("", replica.replica_id):
                # Restarted on its address between two calls: nothing failed, yet its id
                # at weightsync, which the version gate counts by, is new. Re-read it.
                await self._lost(replica, f"restarted as {pushed_id}")
                await self._returned(replica)
            replica.occupancy = occupancy
            pressure = self.pressure()
            if occupancy is not None and pressure is not None and self.on_pressure is not None:
                await self.on_pressure(*pressure)

        await follow_occupancy(lambda: replica.client, report)

    async def _probe(self, replica: Replica) -> None:
        misses = 0
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                misses = await self._probe_once(replica, misses)
            except Exception:  # a probe that dies would never bring its replica back
                log.exception("probing inference replica %d at %s", replica.index, replica.address)

    async def _probe_once(self, replica: Replica, misses: int) -> int:
        """One health probe; returns the count of consecutive failed probes."""
        ok = await replica.client.serving(timeout=max(self.probe_s, PROBE_TIMEOUT_S))
        misses = 0 if ok else misses + 1
        if ok and not replica.serving:
            await self._returned(replica)
        elif not ok:
            # two misses in a row: one slow answer on a busy machine is not a loss (a
            # failed call marks the replica lost at once anyway)
            if replica.serving and misses >= PROBE_MISSES:
                await self._lost(replica, "health check failed")
            state = replica.client.channel.get_state()
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                replica.old_channels.append((time.monotonic(), replica.client.reconnect()))
        await self._close_idle_channels(replica)
        return misses

    async def _close_idle_channels(self, replica: Replica) -> None:
        # An old channel may still carry a call that has not failed yet: a Generate (its
        # tokens are outstanding) or a status call (bounded by STATUS_TIMEOUT_S).
        if replica.outstanding_tokens:
            return
        settled = time.monotonic() - 2 * STATUS_TIMEOUT_S
        old = [channel for since, channel in replica.old_channels if since < settled]
        replica.old_channels = [(t, c) for t, c in replica.old_channels if t >= settled]
        for channel in old:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _lost(self, replica: Replica, reason: str) -> None:
        replica.last_error = reason
        if replica.serving:
            replica.serving = False
            self.versions.changed()  # it no longer holds the version gate back
            others = sum(r.serving for r in self.replicas)
            log.warning(
                "inference replica %d at %s lost (%s); %d of %d replicas serving",
                replica.index,
                replica.address,
                reason,
                others,
                len(self.replicas),
            )

    async def _returned(self, replica: Replica) -> None:
        try:
            replica.read_info(await replica.client.info(timeout=STATUS_TIMEOUT_S))
        except PeerError as exc:  # not back after all: the next probe tries again
            replica.last_error = str(exc)
            return
        async with self._changed:
            replica.serving = True
            self._waiting_logged = False
            self._changed.notify_all()
        self.versions.changed()
        log.info(
            "inference replica %d at %s serves again; %d of %d replicas serving",
            replica.index,
            replica.address,
            sum(r.serving for r in self.replicas),
            len(self.replicas),
        )

    # ---- routing -----------------------------------------------------------------------

    def choose(self, affinity: str = "") -> Replica | None:
        """The replica that last served `affinity` if it still serves, else the serving
        replica with the least outstanding work, those whose pushed queue or KV cache is
        past the in-flight targets last (None if none serves). A replica that has not
        reported counts as within them."""
        sticky = self._affinity.get(affinity) if affinity else None
        if sticky is not None and self.replicas[sticky].serving:
            return self.replicas[sticky]
        serving = [r for r in self.replicas if r.serving]
        if not serving:
            return None
        now = time.monotonic()
        return min(serving, key=lambda r: r.route_key(self.inflight, now))

    def _down_summary(self) -> str:
        return "; ".join(
            f"{r.address}: {r.last_error or 'not serving'}" for r in self.replicas if not r.serving
        )

    def remember(self, affinity: str, replica: Replica) -> None:
        """`replica` takes `affinity`: later calls naming it go there while it serves."""
        self._affinity[affinity] = replica.index
        self._affinity.move_to_end(affinity)
        while len(self._affinity) > AFFINITY_KEYS:
            self._affinity.popitem(last=False)

    async def _acquire(self, affinity: str = "") -> Replica:
        """A serving replica, waiting up to `lost_timeout_s` for one if none serves."""
        replica = self.choose(affinity)
        if replica is not None:
            return replica
        if not self._waiting_logged:
            self._waiting_logged = True
            log.warning(
                "no inference replica serves (%s); waiting up to %.0fs for one to return",
                self._down_summary(),
                self.lost_timeout_s,
            )
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.choose() is not None),
                    self.lost_timeout_s,
                )
            except TimeoutError:
                raise PeerError(
                    f"no inference replica served for {self.lost_timeout_s:.0f}s "
                    f"({self._down_summary()}); orchestrator.recovery.peer_loss_s sets "
                    "how long to wait"
                ) from None
        replica = self.choose(affinity)
        assert replica is not None
        return replica

    # ---- the InferenceClient interface -----------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        n: int,
        max_tokens: int,
        request_id: str = "",
        affinity: str = "",
        **sampling: Any,
    ) -> list[Completion]:
        """All `n` completions of one prompt from one replica, retried elsewhere if that
        replica fails; each attempt is whole (a failed attempt's completions are dropped).
        `affinity`: prefer the replica that served this key last (see the module doc);
        `sampling`: the rest of `InferenceClient.generate`'s options."""

        def call(client: InferenceClient) -> Awaitable[list[Completion]]:
            return client.generate(
                prompt_ids, n=n, max_tokens=max_tokens, request_id=request_id, **sampling
            )

        cost = n * (len(prompt_ids) + max_tokens)
        return await self._on_a_replica(call, "Generate", cost, request_id, affinity)

    async def score(
        self, token_ids: list[int], *, start: int, request_id: str = "", affinity: str = ""
    ) -> tuple[float, ...]:
        """Score's logprobs of `token_ids[start:]`, routed and retried as Generate."""

        def call(client: InferenceClient) -> Awaitable[tuple[float, ...]]:
            return client.score(token_ids, start=start, request_id=request_id)

        return await self._on_a_replica(call, "Score", len(token_ids), request_id, affinity)

    async def _on_a_replica(
        self,
        call: Callable[[InferenceClient], Awaitable[T]],
        method: str,
        cost: int,
        request_id: str,
        affinity: str,
    ) -> T:
        """`call` on one replica, retried whole on another while replicas are lost."""
        first_failure: float | None = None
        while True:
            replica = await self._acquire(affinity)
            if affinity:  # at once: the group's concurrent first turns follow this one
                self.remember(affinity, replica)
            replica.outstanding_tokens += cost
            replica.sent += 1
            try:
                result = await call(replica.client)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # this request itself was cancelled
                # the call was cancelled under us (its channel closed): like a lost replica
                exc = PeerError(
                    f"inference at {replica.address}: {method} cancelled",
                    code=grpc.StatusCode.CANCELLED,
                )
                replica.failed += 1
                await self._lost(replica, str(exc))
                continue
            except PeerError as exc:
                if exc.code not in LOST_CODES and exc.code not in BUSY_CODES:
                    raise
                replica.failed += 1
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                if now - first_failure > self.lost_timeout_s:
                    raise PeerError(
                        f"request {request_id} failed on every attempt for "
                        f"{self.lost_timeout_s:.0f}s; last: {exc} "
                        "(orchestrator.recovery.peer_loss_s)",
                        code=exc.code,
                    ) from exc
                if exc.code in BUSY_CODES:
                    await asyncio.sleep(BUSY_BACKOFF_S)
                else:
                    await self._lost(replica, str(exc))
                where = "on another replica" if len(self.replicas) > 1 else "when it serves"
                log.info("request %s: %s; retrying %s", request_id, exc, where)
                continue
            finally:
                replica.outstanding_tokens -= cost
            replica.served += 1
            return result

    def loaded_version(self) -> int:
        """The oldest version a serving replica has loaded, as weightsync pushed it (-1
        while one has loaded none or none serves)."""
        serving = [self.versions.loaded(r.replica_id) for r in self.replicas if r.serving]
        return min(serving, default=-1)

    async def wait_loaded(self, version: int) -> int:
        """Wait until every serving replica has loaded `version` or newer; returns the
        oldest they have loaded."""
        await self.versions.wait_until(lambda: self.loaded_version() >= version)
        return self.loaded_version()

    async def policy_version(self) -> int:
        """The oldest version the serving replicas have loaded, once each has one."""
        return await self.wait_loaded(0)

    def pressure(self) -> tuple[int, float] | None:
        """(longest queue, fullest KV cache) the serving replicas pushed, counting fresh
        reports only; None while none has one."""
        now = time.monotonic()
        reports = [fresh(r.occupancy, now) for r in self.replicas if r.serving]
        known = [r for r in reports if r is not None]
        if not known:
            return None
        return max(r.queued for r in known), max(r.kv_usage for r in known)

    def summary(self) -> list[str]:
        """One line per replica: what it served."""
        return [
            f"inference replica {r.index} at {r.address}: {r.served} requests served, "
            f"{r.failed} failed and retried elsewhere"
            for r in self.replicas
        ]

    async def close(self) -> None:
        for task in self._probes:
            task.cancel()
        for task in self._probes:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for replica in self.replicas:
            for _, channel in replica.old_channels:
                with contextlib.suppress(Exception):
                    await channel.close()
            await replica.client.close()
