"""Deliver every Train step exactly once, riding out a trainer that died and came back.

A Train that fails UNAVAILABLE (or, from a trainer restarted within the channel's own
retries, FAILED_PRECONDITION) waits up to `recovery.peer_loss_s` for the trainer, reads its
last step T, and re-sends the very same requests of the steps it lost (kept for the last
`keep_sent_steps`) before step n; a step it had trained is answered as a duplicate. The
run's end waits for weightsync to push the last version as published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

import grpc

from tidal.batch.packing import PackedMicroBatch
from tidal.orchestrator.config import RecoveryConfig
from tidal.orchestrator.peers.peer_client import PeerError
from tidal.orchestrator.peers.trainer_client import TrainerClient, TrainResult, train_request
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.rpc.v1 import trainer_pb2 as pb

log = logging.getLogger(__name__)
RIDE_OUT = {grpc.StatusCode.UNAVAILABLE}
RECHECK_S = 1.0
"""While the last version is not published, how often the trainer is asked for its step."""


class TrainDelivery:
    def __init__(self, trainer: TrainerClient, recovery: RecoveryConfig, *, timeout_s: float):
        self.trainer = trainer
        self.recovery = recovery
        self.timeout_s = timeout_s
        self._sent: OrderedDict[int, pb.TrainRequest] = OrderedDict()
        self.resent_steps: list[int] = []
        """Steps re-sent to a trainer that had lost them (for logs and tests)."""
        self.outages = 0
        """How many times the trainer was lost and waited for."""

    async def train(
        self, step: int, micro_batches: Sequence[PackedMicroBatch], *, sft: bool
    ) -> TrainResult:
        request = train_request(step, micro_batches, sft=sft)
        self._sent[step] = request
        while len(self._sent) > self.recovery.keep_sent_steps:
            self._sent.popitem(last=False)
        return await self._deliver(request)

    async def wait_published(self, step: int, versions: VersionFeed) -> None:
        """Wait until weightsync pushes version `step` as published (the trainer answers
        Train before it publishes: tidal.trainer.step_persistence). Only while it has not
        is the trainer asked, every RECHECK_S, whether it restarted from an older
        checkpoint and lost the step: the lost steps are re-sent, as for a lost Train; or
        whether the step's writes met a full disk (`DiskFull`: the version never comes)."""
        deadline = time.monotonic() + self.timeout_s
        peer_deadline: float | None = None
        while True:
            published = versions.wait_until(lambda: versions.published >= step)
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(published, RECHECK_S)
            try:
                trained = await self.trainer.last_step()
                if trained < step:  # restarted from an older checkpoint
                    await self._resend_lost(step + 1, trained)
            except PeerError as exc:
                if exc.code not in RIDE_OUT:
                    raise
                if peer_deadline is None:
                    peer_deadline = time.monotonic() + self.recovery.peer_loss_s
                    self.outages += 1
                await self._reconcile(step + 1, peer_deadline)
            if time.monotonic() > deadline:
                raise PeerError(
                    f"trainer at {self.trainer.address} trained step {step} but weightsync "
                    "has not registered its version within orchestrator.timeouts.train_s"
                )

    async def _deliver(self, request: pb.TrainRequest) -> TrainResult:
        deadline: float | None = None
        caught_up = False
        while True:
            try:
                return await self.trainer.send(request, timeout=self.timeout_s)
            except PeerError as exc:
                if exc.code == grpc.StatusCode.FAILED_PRECONDITION and not caught_up:
                    # A trainer restarted within the channel's own UNAVAILABLE retries
                    # never shows us UNAVAILABLE: it refuses step n as out of order.
                    caught_up = await self._catch_up(request.step)
                    if caught_up:
                        continue
                if exc.code not in RIDE_OUT:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + self.recovery.peer_loss_s
                    self.outages += 1
                log.warning(
                    "trainer at %s lost during Train(step=%d) (%s); waiting up to %.0fs for "
                    "it to come back",
                    self.trainer.address,
                    request.step,
                    exc,
                    max(0.0, deadline - time.monotonic()),
                )
                await self._reconcile(request.step, deadline)

    async def _catch_up(self, step: int) -> bool:
        """Re-send the steps before `step` that a trainer restarted from an older
        checkpoint lost; False when it lost none (the refusal stands)."""
        trained = await self.trainer.last_step()
        if trained >= step - 1:
            return False
        self.outages += 1
        await self._resend_lost(step, trained)
        return True

    async def _reconcile(self, step: int, deadline: float) -> None:
        """Wait for the trainer, then re-send whatever steps before `step` it lost."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError(
                f"trainer at {self.trainer.address} did not come back within "
                f"orchestrator.recovery.peer_loss_s = {self.recovery.peer_loss_s:.0f}s "
                f"(Train(step={step}) not delivered)"
            )
        try:
            await self.trainer.wait_serving(remaining)
            trained = await self.trainer.last_step()
            await self._resend_lost(step, trained)
        except PeerError as exc:
            if exc.code is not None and exc.code not in RIDE_OUT:
                raise
            # Gone again (or not back in time): the caller's next attempt fails and
            # brings us back here, until the deadline.

    async def _resend_lost(self, step: int, trained: int) -> None:
        if trained < step - 1:
            log.warning(
                "trainer at %s is back at step %d (restarted from an older checkpoint); "
                "re-sending steps %d..%d",
                self.trainer.address,
                trained,
                trained + 1,
                step - 1,
            )
        for lost in range(trained + 1, step):
            request = self._sent.get(lost)
            if request is None:
                raise PeerError(
                    f"trainer at {self.trainer.address} is back at step {trained} but the "
                    f"orchestrator keeps only the last {self.recovery.keep_sent_steps} sent "
                    f"steps (step {lost} is not among them): raise "
                    "orchestrator.recovery.keep_sent_steps to at least trainer.ckpt.interval, "
                    "or keep trainer.ckpt.journal on"
                )
            await self.trainer.send(request, timeout=self.timeout_s)
            self.resent_steps.append(lost)
        if trained >= step:
            log.info("trainer had trained step %d before its reply was lost; asking again", step)
        else:
            log.info("trainer at %s is back at step %d", self.trainer.address, trained)
