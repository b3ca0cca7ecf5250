"""Free loopback ports for servers that a launcher configures now and a child binds later.

Why not the usual "bind port 0, read it, close": that port comes from the kernel's
ephemeral range (Linux `net.ipv4.ip_local_port_range`, 32768-60999 by default), the
same range every outgoing connection takes its local port from. Between the pick and
the child's bind, any dial on the machine may be given it. Worse, a client that dials
the port before its server listens (a health probe polling a starting service, which
is what every launcher and test here does) can be given that very port as its own local
port: TCP then connects the socket to itself ("self-connect"), the prober reads back its
own TLS ClientHello (WRONG_VERSION_NUMBER), and the server's bind fails with "Address
already in use". CI saw exactly that once.

So `free_port` draws at random from below the ephemeral range, where the kernel never
assigns a port by itself, checks the port is bindable now, and never returns the same
port twice in one process. Other processes choosing ports the same way could still
collide, but only by picking the same port in the same instant out of ~22,000.
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
