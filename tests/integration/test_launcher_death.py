"""No orphans, whatever dies: a launcher killed with SIGKILL takes its services with it
(none keeps running or holds its port; tidal.common.process.launcher_watch), and a service that
keeps
dying is restarted until its budget is spent, then the run fails naming it, with its last
log lines, and stops the others (tidal.cli.supervision)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..tls_fixtures import role_channel

SERVICES = ("weightsync", "trainer", "inference", "orchestrator")
GONE_WITHIN_S = 5.0


def _serving(run_dir: Path, address: str) -> bool:
    with role_channel(run_dir / "tls", "operator", address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _port_free(address: str) -> bool:
    """Whether a new server could listen on `address` (SO_REUSEADDR like gRPC's own
    listeners, so connections in TIME_WAIT do not count; a live listener does)."""
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
            s.listen()
        except OSError:
            return False
    return True


def test_services_die_with_a_sigkilled_launcher_and_free_their_ports(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch("--orchestrator.steps", "1000", "--orchestrator.warmup-steps", "0")
    endpoints = run.wait_for_config()["endpoints"]
    deadline = time.monotonic() + 120
    while not all(_serving(run.run_dir, endpoints[name]) for name in SERVICES):
        assert time.monotonic() < deadline and run.process.poll() is None, run.output()
        time.sleep(0.2)
    assert len(run.services()) == len(SERVICES)

    run.process.kill()
    run.process.wait(timeout=10)
    killed_at = time.monotonic()
    busy = list(SERVICES)
    while time.monotonic() - killed_at < GONE_WITHIN_S:
        busy = [name for name in SERVICES if not _port_free(endpoints[name])]
        if not busy and not run.children():
            break
        time.sleep(0.1)
    assert run.children() == [], f"still running {GONE_WITHIN_S}s after the launcher died"
    assert busy == [], f"ports still held {GONE_WITHIN_S}s after the launcher died: {busy}"


def _pid_of(run, service: str) -> int | None:  # type: ignore[no-untyped-def]
    for pid in run.children():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"tidal.{service}".encode() in argv:
            return pid
    return None


def test_a_child_is_restarted_until_its_budget_is_spent_then_the_run_fails_cleanly(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--orchestrator.steps", "1000",
        "--orchestrator.warmup-steps", "0",
        "--supervision.max-restarts", "1",
        "--supervision.backoff-s", "0.1",
    )  # fmt: skip
    endpoints = run.wait_for_config()["endpoints"]
    deadline = time.monotonic() + 120
    while not all(_serving(run.run_dir, endpoints[name]) for name in SERVICES):
        assert time.monotonic() < deadline and run.process.poll() is None, run.output()
        time.sleep(0.2)
    first = _pid_of(run, "weightsync")
    assert first is not None
    os.kill(first, signal.SIGKILL)
    while (second := _pid_of(run, "weightsync")) in (None, first):  # restarted: a new life
        assert time.monotonic() < deadline and run.process.poll() is None, run.output()
        time.sleep(0.1)
    while not _serving(run.run_dir, endpoints["weightsync"]):  # on the same address
        assert time.monotonic() < deadline and run.process.poll() is None, run.output()
        time.sleep(0.1)
    assert second is not None
    os.kill(second, signal.SIGKILL)  # the budget (1 restart) is spent: the run fails

    assert run.process.wait(timeout=60) == 1
    output = run.output()
    assert "weightsync killed by signal SIGKILL; restarting it" in output
    assert "weightsync killed by signal SIGKILL; its restart budget is spent" in output
    assert "weightsync.log" in output and "  | " in output  # its last log lines
    record = json.loads((run.run_dir / "supervision.json").read_text())
    assert record["restarts"]["weightsync"] == 1
    assert [e["restarted"] for e in record["exits"] if e["service"] == "weightsync"] == [
        True,
        False,
    ]
    gone = time.monotonic() + GONE_WITHIN_S
    while run.children() and time.monotonic() < gone:
        time.sleep(0.1)
    assert run.children() == [], "services left running after the run failed"
