"""Secure channels for tests (the session's CA and certificates: `tls_folder` in conftest).

`role_channel` /
`aio_role_channel` dial a Tidal server as one role over mTLS (the way `tidal client` and
the services do), for integration tests that talk to a `tidal rl` run or to services
started as processes.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from tidal.common.security.config import SecurityConfig
from tidal.common.security.transport import TransportSecurity


def role_security(folder: Path, role: str, mode: str = "mtls") -> TransportSecurity:
    config = SecurityConfig.model_validate({"mode": mode, "tls_dir": str(folder)})
    return TransportSecurity.from_config(config, role, folder)


def _credentials(folder: Path, role: str) -> grpc.ChannelCredentials:
    credentials = role_security(folder, role).channel_credentials()
    assert credentials is not None
    return credentials


def role_channel(folder: Path, role: str, address: str) -> grpc.Channel:
    """A blocking channel to `address` presenting `role`'s certificate from `folder`."""
    return grpc.secure_channel(address, _credentials(folder, role))


def aio_role_channel(folder: Path, role: str, address: str) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(address, _credentials(folder, role))


def run_tls(run_dir: Path) -> Path:
    """Where `tidal rl` keeps a run's certificates."""
    return run_dir / "tls"
