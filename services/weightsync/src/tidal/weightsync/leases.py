"""Replica leases: a replica pins versions on disk only while it is alive.

Decisions:
- A replica holds a lease while it has a `Watch` stream open (every replica keeps one
  for its whole life) and for `lease_s` seconds after its last sign of life: opening or
  closing a stream, `BeginLoad`, `AckLoaded`. A replica that was killed (its stream is
  gone: the connection's keepalive notices) or stopped renewing thus stops pinning the
  version it served and the one it was loading after `lease_s`, and retention may
  delete them. A replica restarted under a new id therefore does not pin one more
  version per restart.
- Expiry is evaluated when it matters, at retention time (`expired()` is called by the
  registry before it decides what to keep) and when a replica calls in; there is no
  timer task. An expired replica that comes back (reconnects its stream) registers
  again, as a new replica would.
- Time comes from a monotonic clock, injectable for tests.
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
