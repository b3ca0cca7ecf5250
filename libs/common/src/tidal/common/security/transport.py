"""Transport security of one process: its role, its credentials, what its servers check.

`TransportSecurity` is built once per process from `[security]` and handed explicitly to
every server and channel, so nothing is plaintext by accident. Plaintext is loopback only
(`PLAINTEXT_LOOPBACK` for in-process tests); docs/operations.md, "Modes", describes mtls,
token and plaintext.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc

from tidal.common.config.shared import SharedConfig
from tidal.common.errors import ConfigError
from tidal.common.security.config import SecurityConfig, host_of, is_loopback
from tidal.common.security.credentials import (
    CA_CERT,
    ROLES,
    VERIFIERS_FILE,
    cert_path,
    key_path,
    token_path,
)

Mode = Literal["mtls", "token", "plaintext"]
TOKEN_PREFIX = "Bearer "


@dataclass(frozen=True)
class TransportSecurity:
    """How one process's servers listen and its channels dial."""

    mode: Mode
    role: str
    ca_pem: bytes = b""
    cert_pem: bytes = b""
    key_pem: bytes = b""
    token: str = ""
    verifiers: Mapping[str, str] = field(default_factory=dict)
    reflection: bool = False

    @classmethod
    def plaintext_loopback(cls, role: str = "operator") -> TransportSecurity:
        """No TLS, no authentication; binds and dials loopback addresses only."""
        return cls("plaintext", role)

    @classmethod
    def from_config(cls, config: SecurityConfig, role: str, run_dir: Path) -> TransportSecurity:
        """Read this role's credentials; ConfigError naming the key when one is missing."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        if config.mode == "plaintext":
            return cls("plaintext", role, reflection=config.reflection)
        folder = config.folder(run_dir)
        hint = (
            f"create them with `tidal certs --out {folder}` (tidal rl does this itself), "
            "point security.tls_dir at your own, or set security.mode"
        )
        ca = _read(config.ca_cert or folder / CA_CERT, "security.ca_cert", hint)
        cert = key = b""
        if config.mode == "mtls" or role != "operator":  # token-mode clients need no cert
            cert = _read(config.cert or cert_path(folder, role), "security.cert", hint)
            key = _read(config.key or key_path(folder, role), "security.key", hint)
        if config.mode == "mtls":
            return cls("mtls", role, ca, cert, key, reflection=config.reflection)
        token = _token(config, folder, role)
        verifiers_file = config.token_verifiers or folder / VERIFIERS_FILE
        raw = _read(verifiers_file, "security.token_verifiers", hint)
        try:
            verifiers = {str(k): str(v) for k, v in json.loads(raw).items()}
        except (ValueError, AttributeError) as exc:
            raise ConfigError(
                f"security.token_verifiers: {verifiers_file} is not a JSON object of "
                f"role -> sha256 hex ({exc})"
            ) from None
        return cls("token", role, ca, cert, key, token, verifiers, config.reflection)

    def check_address(self, address: str, what: str) -> None:
        if self.mode == "plaintext" and not is_loopback(host_of(address)):
            raise ValueError(
                f"refusing to {what} {address} without TLS: plaintext is for loopback only "
                '(set security.mode = "mtls" or "token")'
            )

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """None for plaintext (an insecure port)."""
        if self.mode == "plaintext":
            return None
        if not (self.cert_pem and self.key_pem):
            raise ValueError(f"role {self.role!r} has no certificate and key to serve TLS with")
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.ca_pem if self.mode == "mtls" else None,
            require_client_auth=self.mode == "mtls",
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """None for plaintext (an insecure channel)."""
        if self.mode == "mtls":
            return grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)
        if self.mode == "token":
            return grpc.composite_channel_credentials(
                grpc.ssl_channel_credentials(self.ca_pem),
                grpc.access_token_call_credentials(self.token),
            )
        return None


PLAINTEXT_LOOPBACK = TransportSecurity.plaintext_loopback()
"""For in-process tests and tools on one host: plaintext, loopback addresses only."""


def _read(path: Path, key: str, hint: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path} ({exc.strerror}); {hint}") from None


def _token(config: SecurityConfig, folder: Path, role: str) -> str:
    if config.token_env is not None:
        value = os.environ.get(config.token_env, "").strip()
        if not value:
            raise ConfigError(
                f"security.token_env: environment variable {config.token_env} is unset or empty"
            )
        return value
    path = config.token_file or token_path(folder, role)
    hint = f"create tokens with `tidal certs --out {folder} --tokens` or set security.token_env"
    return _read(path, "security.token_file", hint).decode().strip()


def for_service(config: SharedConfig, role: str) -> TransportSecurity:
    """The transport security of `role` in the run `config` describes (ConfigError)."""
    return TransportSecurity.from_config(config.security, role, config.run.dir)


def check_or_exit(config: SharedConfig, role: str) -> None:
    """At a service's start: exit 2 with the config error when its credentials are
    missing or unreadable, instead of a traceback later."""
    try:
        for_service(config, role)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
