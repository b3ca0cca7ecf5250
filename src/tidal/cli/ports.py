"""Free loopback ports for servers that a launcher configures now and a child binds later.

Drawn at random below the kernel's ephemeral range, checked bindable, never returned twice
in one process: a port from `bind(0)` can be handed to any dial before the child binds it,
even to the probe of that very server (docs/operations.md, "Supervision and restarts").
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
"""Linux's default; macOS and Windows use 49152-65535, above it."""
LOWEST = 10000
"""Below this sit well-known and registered ports that services on a host often hold."""
TRIES = 200

_handed_out: set[int] = set()
_lock = threading.Lock()
_rng = random.Random()  # its own: the draws neither use nor disturb the global seed


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for local ports of outgoing connections (inclusive)."""
    try:
        low, high = EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def outside_ephemeral() -> tuple[int, int] | None:
    """The larger port range below or above the ephemeral one (inclusive), or None
    where neither holds a hundred ports."""
    low, high = ephemeral_range()
    below, above = (LOWEST, low - 1), (max(high + 1, LOWEST), 65535)
    best = max(below, above, key=lambda r: r[1] - r[0])
    return best if best[1] - best[0] >= 100 else None


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind `host:port` now (no SO_REUSEADDR: a port with
    connections in TIME_WAIT counts as taken, so a chosen port is really idle)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _outside_ephemeral_port() -> int | None:
    span = outside_ephemeral()
    if span is None:
        return None
    for _ in range(TRIES):
        port = _rng.randint(*span)
        if port not in _handed_out and bindable(port):
            return port
    return None


def free_port() -> int:
    """A loopback port outside the ephemeral range, bindable now and not returned before
    by this process. Falls back to a kernel-chosen port only where the kernel leaves no
    room outside its ephemeral range (then with the race described above)."""
    with _lock:
        port = _outside_ephemeral_port()
        while port is None or port in _handed_out:
            port = _kernel_port()
        _handed_out.add(port)
        return port


def free_address() -> str:
    """`127.0.0.1:<free_port()>`: for a server to bind later, or for a client test that
    needs an address nobody listens on (outside the ephemeral range, so a dial to it
    cannot self-connect)."""
    return f"127.0.0.1:{free_port()}"
