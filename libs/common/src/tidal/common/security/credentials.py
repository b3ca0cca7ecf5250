"""A run-local certificate authority, one leaf certificate and one token per role; `tidal certs`.

Every process proves its role with a certificate the run's CA signed, the role carried as
the SAN URI `tidal://role/<role>`; leaves cannot sign. Keys are written 0600 and
atomically into a folder made 0700 (an existing folder keeps its mode), and existing
files are reused, so a resumed run keeps its identities (docs/operations.md,
"Certificates").
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import ipaddress
import json
import os
import secrets
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidal.common.files.modes import make_private_dirs

ROLES = ("orchestrator", "inference", "trainer", "weightsync", "operator")
"""Every identity in a run: the four services and `operator` (`tidal client`, people)."""
ROLE_URI_PREFIX = "tidal://role/"
CA_CERT, CA_KEY = "ca.pem", "ca.key"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_LEAF_DAYS, _CA_DAYS = 730, 3650


def cert_path(folder: Path, role: str) -> Path:
    return folder / f"{role}.pem"


def key_path(folder: Path, role: str) -> Path:
    return folder / f"{role}.key"


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` atomically, created with `mode` less the process's umask (so
    the run's file policy applies to public files; a key's 0600 is never widened)."""
    make_private_dirs(path.parent)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san_entries(role: str, hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(ROLE_URI_PREFIX + role)]
    for host in dict.fromkeys([*LOOPBACK_HOSTS, *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _load_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())
    key = serialization.load_pem_private_key((folder / CA_KEY).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{folder / CA_KEY} is not an EC private key")
    return cert, key


def _make_ca(folder: Path, name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Tidal run CA {name}")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(folder / CA_KEY, _key_pem(key))
    write_private(folder / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def issue_leaf(
    folder: Path,
    role: str,
    hosts: Sequence[str],
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
) -> None:
    """Write `<role>.pem` / `<role>.key` signed by `ca` (overwrites them)."""
    ca_cert, ca_key = ca
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, role)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=_LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(_san_entries(role, hosts)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    write_private(key_path(folder, role), _key_pem(key))
    write_private(cert_path(folder, role), cert.public_bytes(serialization.Encoding.PEM), 0o644)


def ensure_certificates(
    folder: Path, hosts: Sequence[str] = (), *, roles: Sequence[str] = ROLES, name: str = "tidal"
) -> list[str]:
    """Create the CA (if absent) and every missing role's certificate in `folder`.

    Existing files are kept (a resumed run keeps its identities). Returns the roles whose
    certificate was created now. Raises ValueError for a CA certificate without its key
    when a leaf is missing (then new leaves cannot be signed).
    """
    missing = [
        r for r in roles if not (cert_path(folder, r).exists() and key_path(folder, r).exists())
    ]
    if not missing:
        return []
    make_private_dirs(folder)
    if (folder / CA_CERT).exists():
        if not (folder / CA_KEY).exists():
            raise ValueError(
                f"{folder / CA_CERT} exists without {CA_KEY}: cannot sign certificates for "
                f"{', '.join(missing)}; put their <role>.pem/.key in {folder} or remove ca.pem"
            )
        ca = _load_ca(folder)
    else:
        ca = _make_ca(folder, name)
    # One thread per leaf: each write is fsynced (~10 ms of waiting, no CPU), and this is
    # on `tidal rl`'s start-up path before any service starts; in turn they took ~0.15 s.
    with ThreadPoolExecutor(len(missing), thread_name_prefix="issue-cert") as pool:
        list(pool.map(lambda role: issue_leaf(folder, role, hosts, ca), missing))
    return missing


def role_of_certificate(pem: bytes) -> str | None:
    """The role a certificate carries (its `tidal://role/<role>` SAN URI), if any."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(ROLE_URI_PREFIX):
            return uri[len(ROLE_URI_PREFIX) :]
    return None


VERIFIERS_FILE = "token-verifiers.json"


def token_path(folder: Path, role: str) -> Path:
    return folder / f"{role}.token"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def ensure_tokens(folder: Path, roles: Sequence[str] = ROLES) -> list[str]:
    """Create a random token per missing role (`<role>.token`, 0600) and rewrite the
    verifiers file from all of them. Existing tokens are kept. Returns the created roles."""
    created = []
    for role in roles:
        path = token_path(folder, role)
        if not path.exists():
            write_private(path, f"{role}.{secrets.token_urlsafe(32)}\n".encode())
            created.append(role)
    digests = {r: token_digest(token_path(folder, r).read_text().strip()) for r in roles}
    write_private(folder / VERIFIERS_FILE, json.dumps(digests, indent=1).encode(), 0o644)
    return created


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="tidal certs",
        description="Create a CA and one certificate per role (" + ", ".join(ROLES) + ") in "
        "--out; existing files are kept.",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write into")
    parser.add_argument(
        "--hosts",
        default="",
        help="comma-separated extra host names/IPs every certificate is valid for "
        "(localhost, 127.0.0.1 and ::1 always are), e.g. orchestrator,inference,trainer,weightsync",
    )
    parser.add_argument(
        "--tokens", action="store_true", help="also write per-role tokens (security.mode token)"
    )
    parser.add_argument("--name", default="tidal", help="name in the CA's subject")
    opts = parser.parse_args(list(argv))
    hosts = [h.strip() for h in opts.hosts.split(",") if h.strip()]
    try:
        created = ensure_certificates(opts.out, hosts, name=opts.name)
        if opts.tokens:
            created += [f"{r} token" for r in ensure_tokens(opts.out)]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"tidal certs: {opts.out}: created {', '.join(created) or 'nothing (all present)'}")


if __name__ == "__main__":
    main(sys.argv[1:])
