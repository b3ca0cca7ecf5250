"""Replica leases: a replica pins versions on disk only while it is alive.

A lease holds while the replica has a `Watch` stream open and for `lease_s` after its last
sign of life, so a killed replica, or one restarted under a new id, stops pinning versions.
Expiry is evaluated when it matters (at retention, when a replica calls in), with no timer
task; time comes from an injectable monotonic clock.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable


class Leases:
    def __init__(self, lease_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._renewed: dict[str, float] = {}  # replica id → last sign of life
        self._streams: Counter[str] = Counter()  # replica id → open Watch streams

    def renew(self, replica_id: str) -> None:
        self._renewed[replica_id] = self._clock()

    def stream_opened(self, replica_id: str) -> None:
        self._streams[replica_id] += 1
        self.renew(replica_id)

    def stream_closed(self, replica_id: str) -> None:
        self._streams[replica_id] -= 1
        if self._streams[replica_id] <= 0:
            del self._streams[replica_id]
        self.renew(replica_id)  # the lease runs from the moment the stream went away

    def alive(self, replica_id: str) -> bool:
        if self._streams.get(replica_id, 0) > 0:
            return True
        renewed = self._renewed.get(replica_id)
        return renewed is not None and self._clock() - renewed <= self.lease_s

    def expired(self, replica_ids: list[str]) -> list[str]:
        """The ids among `replica_ids` whose lease has lapsed; they are forgotten."""
        gone = [r for r in replica_ids if not self.alive(r)]
        for replica_id in gone:
            self._renewed.pop(replica_id, None)
        return gone
