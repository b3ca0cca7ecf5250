"""`free_port` hands out loopback ports a later bind gets: outside the kernel's ephemeral
range (no outgoing connection, and no self-connecting probe, can take them), idle now,
never twice."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.cli import ports


@pytest.fixture
def ephemeral(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in for /proc's ip_local_port_range; the test writes the range."""
    path = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", path)
    yield path


def test_ports_lie_outside_the_ephemeral_range_and_never_repeat() -> None:
    low, high = ports.ephemeral_range()
    handed = [ports.free_port() for _ in range(50)]
    assert len(set(handed)) == len(handed)
    assert all(not low <= p <= high and p >= ports.LOWEST for p in handed)
    for port in handed[:5]:  # each binds, as a server started later would
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


class FirstDraws(random.Random):
    """Draws the given ports first, then random ones as usual."""

    def __init__(self, *first: int) -> None:
        super().__init__()
        self.first = list(first)

    def randint(self, a: int, b: int) -> int:
        return self.first.pop(0) if self.first else super().randint(a, b)


def test_a_port_in_use_or_handed_out_before_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    given = ports.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen()
        busy = held.getsockname()[1]
        monkeypatch.setattr(ports, "_rng", FirstDraws(busy, given))
        port = ports.free_port()
        assert port not in (busy, given)
        assert ports.bindable(port)


def test_the_kernel_range_is_read_and_a_range_covering_everything_falls_back(
    ephemeral: Path,
) -> None:
    ephemeral.write_text("20000\t60999\n")
    assert ports.ephemeral_range() == (20000, 60999)
    assert ports.outside_ephemeral() == (10000, 19999)
    ephemeral.write_text("1024 65535\n")
    assert ports.outside_ephemeral() is None
    assert 1024 <= ports.free_port() <= 65535  # the kernel's choice: no room outside
    ephemeral.write_text("not a range")
    assert ports.ephemeral_range() == ports.DEFAULT_EPHEMERAL
