"""One inference replica as the pool sees it: its client, health, counts and occupancy.

The pool (inference_pool.py) owns the list and every change to it; this is the record
and the order replicas are chosen in (`route_key`), kept apart so the pool module holds
only routing, retry and ride-out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from tidal.orchestrator.config import InflightConfig
from tidal.orchestrator.peers.inference_client import (
    InferenceClient,
    ReplicaInfo,
    ReplicaOccupancy,
)
from tidal.orchestrator.peers.occupancy import saturated


@dataclass
class Replica:
    """One inference replica and what the pool knows of it."""

    index: int
    client: InferenceClient
    serving: bool = True
    replica_id: str = ""
    """Its id at weightsync (GetStatus), read whenever it starts serving: a replica
    restarted on the same address may carry another."""
    max_seq_len: int = 0
    """Its context length (GetStatus), read with `replica_id`; 0 until read."""
    outstanding_tokens: int = 0
    sent: int = 0
    """Generate (and Score) attempts sent to it."""
    served: int = 0
    """Generate (and Score) calls it completed."""
    failed: int = 0
    """Attempts that failed on it and were retried elsewhere."""
    last_error: str = ""
    occupancy: ReplicaOccupancy | None = None
    """What it pushed last; None while its stream is down or before its first report."""
    old_channels: list[tuple[float, grpc.aio.Channel]] = field(default_factory=list)
    """Channels replaced by a reconnect, with when; closed once nothing can still use
    them (closing a channel cancels its calls)."""

    @property
    def address(self) -> str:
        return self.client.address

    def read_info(self, info: ReplicaInfo) -> None:
        self.replica_id, self.max_seq_len = info.replica_id, info.max_seq_len

    def route_key(self, targets: InflightConfig, now: float) -> tuple[bool, int, int, int]:
        """Lowest first: within the occupancy targets (or not reporting), then the least
        outstanding work, the fewest requests sent, the lowest index."""
        past = saturated(self.occupancy, targets, now)
        return past, self.outstanding_tokens, self.sent, self.index
