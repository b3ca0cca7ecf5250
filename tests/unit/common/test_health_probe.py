"""`python -m tidal.common.grpc.health_probe`, the container probe (Docker HEALTHCHECK, k8s exec
probes), against a real in-process `GrpcServer` over mutual TLS with the session's CA.

The probe reads its security settings from `TIDAL_SECURITY__*` variables, as a container's
do: SERVING exits 0, NOT_SERVING and an address where nothing listens exit 1, a probe
whose certificate the server's CA did not sign is refused (1), and unreadable settings
exit 2. One case runs the module as a process, the way the image's HEALTHCHECK does.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidal.cli.ports import free_address
from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.health_probe import main
from tidal.common.grpc.server import GrpcServer
from tidal.common.security.config import SecurityConfig
from tidal.common.security.credentials import ensure_certificates
from tidal.common.security.transport import TransportSecurity


def _env(tls: Path) -> dict[str, str]:
    # A service-only variable too: the probe must ignore what is not its own.
    return {
        "TIDAL_SECURITY__TLS_DIR": str(tls),
        "TIDAL_SECURITY__MODE": "mtls",
        "TIDAL_TRAINER__LR": "0.1",
    }


@pytest.fixture
async def server(tls_folder: Path) -> AsyncIterator[GrpcServer]:
    security = TransportSecurity.from_config(
        SecurityConfig(tls_dir=tls_folder), "trainer", tls_folder
    )
    server = GrpcServer("127.0.0.1:0", [], GrpcConfig(shutdown_grace_s=0.1), security=security)
    await server.start()
    yield server
    await server.stop()


async def _probe(address: str, env: dict[str, str], role: str = "trainer") -> int:
    # The probe is blocking gRPC; the server lives on this event loop.
    argv = ["--address", address, "--role", role, "--timeout-s", "3"]
    return await asyncio.to_thread(main, argv, env)


async def test_serving_exits_0_and_not_serving_exits_1(
    server: GrpcServer, tls_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    assert await _probe(address, _env(tls_folder)) == 0
    assert await _probe(address, _env(tls_folder), role="operator") == 0  # any role may probe
    await server.set_serving(False)
    assert await _probe(address, _env(tls_folder)) == 1
    assert capsys.readouterr().err.strip().endswith("answers NOT_SERVING")


async def test_unreachable_and_foreign_certificate_exit_1(
    server: GrpcServer,
    tls_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await _probe(free_address(), _env(tls_folder)) == 1
    assert "unhealthy: 127.0.0.1:" in capsys.readouterr().err
    other = tmp_path / "other-ca"
    ensure_certificates(other)  # a different CA: the server must refuse the handshake
    assert await _probe(f"127.0.0.1:{server.port}", _env(other)) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("unhealthy: ") and len(err.splitlines()) == 1


async def test_missing_credentials_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _probe("127.0.0.1:1", _env(tmp_path / "none")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: security.ca_cert: cannot read") and err.count("\n") == 1


async def test_module_runs_as_a_process(server: GrpcServer, tls_folder: Path) -> None:
    env = {**os.environ, **_env(tls_folder)}
    argv = [sys.executable, "-m", "tidal.common.grpc.health_probe"]
    argv += ["--address", f"127.0.0.1:{server.port}", "--role", "inference"]
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stderr=subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
