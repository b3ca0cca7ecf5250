"""The async window: how far generation may run ahead of training, and what is too stale.

One object, `AsyncWindow`, owns every rule that involves `max_async` or the off-policy
bound, so the loop asks it questions instead of doing the arithmetic itself.

Decisions:
- Steps are 1-indexed, versions 0-indexed (version v = the weights after step v), so
  step n updates version n - 1. Rollouts of step n may start once inference has
  *loaded* version `max(0, n - 1 - max_async)`; equivalently, with the newest trained
  step T, generation may start for every step up to `T + 1 + max_async`. With
  `max_async = 0` step n+1 starts only after Train(n) returned and inference loaded
  version n: synchronous, on-policy. With `max_async = 1` (the default) step n+1's
  rollouts are generated while step n trains.
- The gate is on the version inference has *loaded*, not the one weightsync has
  published: a published version inference has not loaded yet would make a step's
  rollouts staler than promised. The v1 contracts push no load events to the
  orchestrator (weightsync's Watch only announces new publishes), so the window asks
  the replica's GetStatus, backing off from 20 ms to 100 ms: a tiny model loads in well
  under a second, and the status call is a few microseconds of server work. A push (e.g.
  a Watch on inference's status) would remove the poll; that is a contract change, not
  done here.
- With several replicas the window reads the pool (inference_pool.py), whose loaded
  version is the oldest any *serving* replica has loaded: a step starts only when every
  replica it may be routed to has the version it needs. A replica that is down does not
  hold the run back.
- Staleness of a sample trained at step n is `(n - 1) - min(policy_versions)`: how many
  optimizer steps the oldest policy that wrote any of its tokens lags behind the policy
  being updated. On-policy samples have staleness 0; the gate keeps it ≤ max_async unless
  inference is late to load a version. The oldest token's version counts, not the
  newest: a completion that spans a reload is only as fresh as its stalest part.
- The bound is `max_off_policy_steps`, by default `max_async + 1`: one version of slack
  for a reload in the middle of a completion and for late loads, so the default drops
  nothing in a healthy run. Samples over the bound are dropped after advantages are
  computed, so the surviving samples keep the baseline of their whole group; the number
  dropped is returned so the step's metrics count it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Protocol, TypeVar

from tidal.orchestrator.config import StalenessConfig

FIRST_POLL_S = 0.02
MAX_POLL_S = 0.1


class LoadedVersionSource(Protocol):
    """Where the window reads the version inference has loaded (its GetStatus)."""

    async def policy_version(self) -> int: ...


class HasStaleness(Protocol):
    @property
    def staleness(self) -> int: ...


S = TypeVar("S", bound=HasStaleness)


class PolicyVersionTimeout(TimeoutError):
    """Inference did not load a needed version in time."""


def version_staleness(step: int, version: int) -> int:
    """How many optimizer steps `version` lags behind the policy step `step` updates."""
    return (step - 1) - version


def sample_staleness(step: int, policy_versions: Sequence[int], *, fallback_version: int) -> int:
    """`(step - 1) - oldest version`; a completion with no tokens uses `fallback_version`."""
    return version_staleness(step, min(policy_versions, default=fallback_version))


class AsyncWindow:
    def __init__(
        self, config: StalenessConfig, inference: LoadedVersionSource, *, wait_timeout_s: float
    ) -> None:
        self.max_async = config.max_async
        self.bound = config.bound
        """The largest staleness a kept sample may have (max_off_policy_steps)."""
        self.inference = inference
        self.wait_timeout_s = wait_timeout_s
        self.loaded = -1
        """Newest version inference was seen to have loaded (-1 before any)."""

    def needed_version(self, step: int) -> int:
        """The version inference must have loaded before step `step`'s rollouts start."""
        return max(0, step - 1 - self.max_async)

    def last_startable_step(self, newest_trained: int) -> int:
        """The last step whose generation may start once step `newest_trained` is trained."""
        return newest_trained + 1 + self.max_async

    def staleness(self, step: int, policy_versions: Sequence[int], *, fallback_version: int) -> int:
        return sample_staleness(step, policy_versions, fallback_version=fallback_version)

    def drop_stale(self, samples: Sequence[S]) -> tuple[list[S], int]:
        """The samples within the bound, and how many were dropped."""
        kept = [s for s in samples if s.staleness <= self.bound]
        return kept, len(samples) - len(kept)

    async def wait_for_step(self, step: int) -> int:
        """Wait until step `step` may generate; returns the version inference has loaded."""
        return await self.wait_loaded(self.needed_version(step))

    async def wait_loaded(self, version: int, *, timeout: float | None = None) -> int:
        """Wait until inference has loaded `version` or newer; returns what it has loaded.

        Raises PolicyVersionTimeout after `timeout` (default: the window's wait timeout).
        """
        timeout = self.wait_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay = FIRST_POLL_S
        while self.loaded < version:
            self.loaded = max(self.loaded, await self.inference.policy_version())
            if self.loaded >= version:
                break
            if time.monotonic() + delay > deadline:
                raise PolicyVersionTimeout(
                    f"inference still serves version {self.loaded} after {timeout:.0f}s; "
                    f"version {version} is needed (is it subscribed to weightsync? "
                    "orchestrator.timeouts.peer_wait_s sets how long to wait)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_POLL_S)
        return self.loaded
