"""Replica leases with an injected clock: an open stream holds the lease; without one it
lasts `lease_s` from the last sign of life; expired replicas are forgotten."""

from __future__ import annotations

from tidal.weightsync.leases import Leases


def test_a_lease_holds_while_watching_and_runs_out_lease_s_after_the_stream_closes() -> None:
    now = [0.0]
    leases = Leases(10.0, clock=lambda: now[0])
    leases.stream_opened("a")
    leases.stream_opened("a")  # a reconnect may overlap the old stream
    now[0] = 100.0
    assert leases.expired(["a"]) == []  # watching: no timeout applies
    leases.stream_closed("a")
    assert leases.alive("a")  # the other stream is still open
    leases.stream_closed("a")
    now[0] = 109.0
    assert leases.expired(["a"]) == []
    leases.renew("a")  # e.g. an AckLoaded
    now[0] = 118.0
    assert leases.expired(["a"]) == []
    now[0] = 119.5
    assert leases.expired(["a", "never-seen"]) == ["a", "never-seen"]
    assert not leases.alive("a")
