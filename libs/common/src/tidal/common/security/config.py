"""The `[security]` section every service reads (docs/operations.md, "Security model").

One section shared by all services, which read one run file; per-role files are found by
name in one folder, with explicit paths for a service deployed alone. Secure by default:
mutual TLS with the run's CA; plaintext only when asked for and every address the run
binds or dials is loopback (`check_plaintext_addresses`, called by `SharedConfig`).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field

from tidal.common.config.loading import BaseConfig


class SecurityConfig(BaseConfig):
    mode: Literal["mtls", "token", "plaintext"] = "mtls"
    """Transport security of every gRPC server and channel. "mtls" (default): TLS both
    ways, each process proves its role with a certificate signed by the run's CA. "token":
    TLS with server certificates only; a client proves its role with a per-role bearer
    token. "plaintext": no TLS and no authentication; allowed only when every endpoint
    (and `grpc.bind_host`) is loopback."""
    tls_dir: Path | None = None
    """Folder holding ca.pem and `<role>.pem`/`<role>.key` per role (token mode also
    `<role>.token` and token-verifiers.json). Default `<run dir>/tls`, which `tidal rl`
    creates when it is missing (`tidal certs --out DIR` for deployments)."""
    ca_cert: Path | None = None
    """CA certificate that signs every service's certificate; default `<tls_dir>/ca.pem`."""
    cert: Path | None = None
    """This process's certificate, for a service deployed alone; default
    `<tls_dir>/<role>.pem`. Leave unset under `tidal rl` (each service has its own)."""
    key: Path | None = None
    """This process's private key; default `<tls_dir>/<role>.key`."""
    token_file: Path | None = None
    """Token mode: file holding this process's token; default `<tls_dir>/<role>.token`.
    Never put a token itself in a config file."""
    token_env: str | None = Field(default=None, min_length=1)
    """Token mode: name of an environment variable holding this process's token (wins
    over `token_file`)."""
    token_verifiers: Path | None = None
    """Token mode: JSON file of sha256 digests of each role's token, which servers check
    tokens against; default `<tls_dir>/token-verifiers.json`."""
    hosts: list[str] = Field(default_factory=list)
    """Extra host names or IPs the certificates `tidal rl` creates are valid for (besides
    localhost, 127.0.0.1 and ::1), e.g. compose service names."""
    reflection: bool = False
    """Serve gRPC server reflection (to any authenticated caller). Off by default."""

    def folder(self, run_dir: Path) -> Path:
        return self.tls_dir if self.tls_dir is not None else run_dir / "tls"


def host_of(address: str) -> str:
    """The host of "host:port", "[v6]:port" or a bare host."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    if address.count(":") == 1:
        return address.rsplit(":", 1)[0]
    return address


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext_addresses(addresses: dict[str, str]) -> None:
    """Raise ValueError naming the first non-loopback address (key → address)."""
    for key, address in addresses.items():
        if not is_loopback(host_of(address)):
            raise ValueError(
                f'security.mode = "plaintext" but {key} = {address!r} is not loopback: '
                'plaintext is allowed only on 127.0.0.1/localhost; use security.mode = "mtls" '
                '(the default) or "token", or bind and dial loopback addresses only'
            )
