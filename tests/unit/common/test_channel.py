"""`connect`: a person's tool learns at once, and by name, that a service is down."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tidal.cli import ports
from tidal.common.errors import Unreachable
from tidal.common.grpc.channel import connect
from tidal.common.security.transport import PLAINTEXT_LOOPBACK


@pytest.fixture
def free_address() -> str:
    """A loopback address nobody listens on."""
    return ports.free_address()


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A listener that never speaks: TCP connects, gRPC never gets its HTTP/2 settings."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


async def test_a_refused_connection_names_the_service_and_address_at_once(
    free_address: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(Unreachable, match=f"cannot reach inference at {free_address} "):
        await connect("inference", free_address, timeout_s=5.0, security=PLAINTEXT_LOOPBACK)
    assert time.monotonic() - started < 1.0  # not the timeout: refused is an answer


async def test_an_address_where_nothing_answers_fails_after_the_timeout(
    silent_address: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(Unreachable, match=r"trainer at .* \(nothing answered within 0.3s\)"):
        await connect("trainer", silent_address, timeout_s=0.3, security=PLAINTEXT_LOOPBACK)
    assert 0.3 <= time.monotonic() - started < 2.0


async def test_a_running_service_gives_a_ready_channel(start_weightsync, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    service = await start_weightsync(tmp_path)
    channel = await connect("weightsync", service.address, security=PLAINTEXT_LOOPBACK)
    async with channel:
        assert channel.get_state() == grpc.ChannelConnectivity.READY
