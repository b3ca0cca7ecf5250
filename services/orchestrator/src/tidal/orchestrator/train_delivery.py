"""Deliver every Train step exactly once, riding out a trainer that died and came back.

Decisions:
- A Train call that fails because the trainer is unreachable (UNAVAILABLE: refused,
  reset, or the trainer still starting) is not the end of the run: the orchestrator
  waits for the trainer to be SERVING again (it may be restarted by `tidal rl`), for at
  most `orchestrator.recovery.peer_loss_s` counted from the first failure, logging the
  peer and its address while it waits, and then reconciles with the trainer's step.
  A trainer restarted so fast that the channel's own retries (channel.py) reached the
  new process never shows UNAVAILABLE: it refuses step n with FAILED_PRECONDITION (out
  of order); when its last step is then behind n-1, that is the same loss and is
  reconciled the same way, once. Any other status (a refused step, a bad request, a
  deadline) still fails the step.
- Reconciling reads the trainer's last trained step T (GetStatus). T ≥ n: step n was
  trained before the reply was lost; it is sent again anyway and the trainer answers
  it from its record (duplicate), which checks that the data are the same (payload
  sha256). T < n-1: the trainer restarted from a checkpoint older than steps the
  orchestrator saw trained; those steps (T+1..n-1) are re-sent first, the very same
  requests (same ids, same data), so every step id is trained exactly once in the
  lineage that survives. Then step n is sent again.
- The requests of the last `keep_sent_steps` steps are kept for that (in memory: a
  restarted orchestrator resumes after the trainer's step instead, resume.py). A
  trainer behind the oldest kept request fails the run, naming the key to raise.
- A retry is the same `TrainRequest` object: same step id, same payload fingerprint.
- The trainer answers Train(n) once step n is trained and publishes version n afterwards
  (tidal.trainer.persistence.steps), so the run's end waits for the last version
  (`wait_published`), re-sending the steps of a trainer that restarted meanwhile.
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
from tidal.orchestrator.client_errors import PeerError
from tidal.orchestrator.config import RecoveryConfig
from tidal.orchestrator.trainer_client import TrainerClient, TrainResult, train_request
from tidal.orchestrator.version_feed import VersionFeed
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
        Train before it publishes: tidal.trainer.persistence.steps). Only while it has not
        is the trainer asked, every RECHECK_S, whether it restarted from an older
        checkpoint and lost the step: the lost steps are re-sent, as for a lost Train."""
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
