"""One generation of the broadcast group: trainer rank 0 → every replica.

A standalone gloo/NCCL process group on the trainer's TCP store, so the trainer's own
torchrun group is left alone and replicas need no global torch.distributed state. A
version is a JSON header, then the buckets of `buckets`, received into one flat buffer
kept across versions (returned tensors are valid until the next `receive`). Idle
receivers hold no collective open: they poll an announce counter in the store, so a
replica exits at once. Replicas `confirm` each version so the trainer can hold back its
catch-up copy; `transports.broadcast` drives forming and re-forming.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tidal.weights.buckets import (
    TensorSpec,
    iter_packed_buckets,
    layout_of,
    specs_of,
    tensor_views,
)
from tidal.weights.transport_choice import BroadcastSeat
from tidal.weights.transports.base import ReceivedVersion

log = logging.getLogger(__name__)
CLOSE = -1
T = TypeVar("T")
POLL_S = 0.002
IDLE_POLL_S = 0.01
ANNOUNCE_KEY = "announced"
ABANDONED_KEY = "abandoned"
ABANDON_CHECK_S = 0.2
CONFIRMED_KEY = "confirmed/v{version}"
CONFIRM_WAIT_S = 10.0
"""Longest the trainer holds back a version's catch-up copy for the replicas' confirms."""


def resolve_backend(name: str) -> str:
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return name


def host_store(host: str, timeout_s: float) -> dist.TCPStore:
    """The trainer's TCP store on a free port (its address goes to weightsync)."""
    return dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )


def connect_store(address: str, timeout_s: float) -> dist.TCPStore:
    host, _, port = address.rpartition(":")
    return dist.TCPStore(
        host,
        int(port),
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


class BroadcastGroup:
    """One member of the group; blocks in `__init__` until every member has joined."""

    def __init__(self, store: dist.Store, seat: BroadcastSeat) -> None:
        self.seat = seat
        self.backend = resolve_backend(seat.backend)
        prefixed = dist.PrefixStore(f"tidal-weights/g{seat.generation}/", store)
        self.store = prefixed
        self._announced = 0  # versions (and closes) the sender has announced so far
        timeout = timedelta(seconds=seat.timeout_s)
        if self.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg: dist.ProcessGroup = dist.ProcessGroupNCCL(
                prefixed, seat.rank, seat.world_size, options
            )
        else:
            self.device = torch.device("cpu")
            self.pg = dist.ProcessGroupGloo(prefixed, seat.rank, seat.world_size, timeout)
        self._buffers: list[torch.Tensor] = []  # the sender's two bucket buffers
        self._flat = torch.empty(0, dtype=torch.uint8, device=self.device)  # receiver's

    def _broadcast_async(self, tensor: torch.Tensor) -> dist.Work:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return self.pg.broadcast([tensor], options)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self._broadcast_async(tensor).wait()

    def _send_header(self, header: dict[str, Any]) -> None:
        self.store.add(ANNOUNCE_KEY, 1)  # receivers post their receives only now
        payload = json.dumps(header).encode()
        self._broadcast(torch.tensor([len(payload)], dtype=torch.int64, device=self.device))
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
        self._broadcast(data)

    def abandon(self) -> None:
        """Rank 0: tell receivers this generation is dead (a peer failed), so they stop
        waiting on it and rejoin the next one."""
        self.store.set(ABANDONED_KEY, "1")
        self.store.add(ANNOUNCE_KEY, 1)  # wakes idle receivers

    def _check_abandoned(self) -> None:
        if self.store.check([ABANDONED_KEY]):
            raise RuntimeError(f"generation {self.seat.generation} was abandoned by the trainer")

    async def _completed(self, work: dist.Work) -> None:
        """Wait for a collective without blocking the loop; raises if it failed, or if the
        trainer abandoned this generation meanwhile (checked every ABANDON_CHECK_S)."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + ABANDON_CHECK_S
        while not work.is_completed():
            await asyncio.sleep(POLL_S)
            if loop.time() >= next_check:
                self._check_abandoned()
                next_check = loop.time() + ABANDON_CHECK_S
        work.wait()  # returns at once; raises the collective's error

    async def _recv_header(self) -> dict[str, Any]:
        while self.store.add(ANNOUNCE_KEY, 0) <= self._announced:
            await asyncio.sleep(IDLE_POLL_S)
        self._announced += 1
        self._check_abandoned()
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        await self._completed(self._broadcast_async(length))
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        await self._completed(self._broadcast_async(data))
        return json.loads(bytes(data.cpu().tolist()))

    def send(
        self,
        version: int,
        step: int,
        hf_config: dict[str, Any],
        state_dict: Mapping[str, torch.Tensor],
        trace_context: dict[str, str] | None = None,
    ) -> None:
        """Rank 0: broadcast one version, bucket by bucket, packing the next bucket while
        the previous one is on the wire (two buffers)."""
        specs = specs_of(state_dict)
        bucket_bytes = self.seat.bucket_bytes
        header = {
            "version": version,
            "step": step,
            "hf_config": hf_config,
            "trace_context": trace_context or {},
            "tensors": [s.to_json() for s in specs],
            "bucket_bytes": bucket_bytes,
        }
        self._send_header(header)
        if not self._buffers:
            self._buffers = [
                torch.empty(bucket_bytes, dtype=torch.uint8, device=self.device) for _ in range(2)
            ]
        layout = layout_of(specs)
        in_flight: dist.Work | None = None
        for bucket in iter_packed_buckets(state_dict, layout, bucket_bytes, self._buffers):
            work = self._broadcast_async(bucket)
            if in_flight is not None:
                in_flight.wait()  # frees the buffer the next bucket is packed into
            in_flight = work
        if in_flight is not None:
            in_flight.wait()

    async def receive(self) -> ReceivedVersion | None:
        """Rank > 0: the next version, or None when the sender closed the group.

        Every bucket is received straight into its slice of one flat buffer, kept across
        versions: the returned tensors view it, so they are valid until the next call.
        All receives are posted at once so the transport never waits for this side.
        """
        header = await self._recv_header()
        if header["version"] == CLOSE:
            return None
        layout = layout_of([TensorSpec.from_json(item) for item in header["tensors"]])
        if self._flat.numel() != layout.total_bytes:  # else reuse: its pages are mapped
            self._flat = torch.empty(0, dtype=torch.uint8, device=self.device)  # free first
            self._flat = torch.empty(layout.total_bytes, dtype=torch.uint8, device=self.device)
        flat = self._flat
        works = [
            self._broadcast_async(flat[start:stop])
            for start, stop in layout.buckets(int(header["bucket_bytes"]))
        ]
        for work in works:
            await self._completed(work)
        return ReceivedVersion(
            int(header["version"]),
            int(header["step"]),
            header["hf_config"],
            tensor_views(flat, layout),
            dict(header.get("trace_context", {})),
        )

    def confirm(self, version: int) -> None:
        """Rank > 0: this replica is done with `version` (serves it, or refused it)."""
        self.store.add(CONFIRMED_KEY.format(version=version), 1)

    def wait_confirmed(self, version: int, timeout_s: float = CONFIRM_WAIT_S) -> int:
        """Rank 0 (blocking): wait until every receiver confirmed `version`, at most
        `timeout_s`; returns how many did."""
        key = CONFIRMED_KEY.format(version=version)
        deadline = time.monotonic() + timeout_s
        while (done := self.store.add(key, 0)) < self.seat.world_size - 1:
            if time.monotonic() >= deadline:
                log.warning(
                    "%d of %d replicas confirmed version %d within %.1fs; writing its "
                    "catch-up copy anyway", done, self.seat.world_size - 1, version, timeout_s,
                )  # fmt: skip
                break
            time.sleep(POLL_S)
        return done

    def close(self) -> None:
        """Rank 0: tell receivers to stop (best effort)."""
        try:
            self._send_header({"version": CLOSE})
        except RuntimeError as exc:
            log.warning("could not close the broadcast group: %s", exc)


def in_daemon_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run a blocking collective in a daemon thread (a thread stuck waiting for a dead peer
    must not keep the process alive at exit, as `asyncio.to_thread`'s pool would)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=target, name=f"weights-{fn.__name__}", daemon=True).start()
    return future


def dispose_in_background(holder: list[BroadcastGroup]) -> None:
    """Drop the last reference to a broken group in a daemon thread: a process group with
    collectives still pending blocks its destructor until they time out (`timeout_s`),
    which must not stall the event loop that should be rejoining meanwhile."""
    threading.Thread(target=holder.clear, name="weights-dispose", daemon=True).start()
