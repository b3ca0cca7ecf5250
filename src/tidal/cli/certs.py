"""`tidal certs`: a CA, per-role certificates and (optionally) tokens for a deployment.

`tidal rl` makes the same files in `<run dir>/tls/` by itself (`ensure_run_credentials`);
this command is for services started one by one (compose, k8s, SLURM): run it once, then
give each service ca.pem and its own `<role>.pem`/`<role>.key` (docs/operations.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tidal.common.certs import ROLES, ensure_certificates
from tidal.common.sections import SharedConfig
from tidal.common.security import ensure_tokens


def ensure_run_credentials(config: SharedConfig) -> list[str]:
    """Create the certificates (and tokens in token mode) a run needs when missing, in
    `security.tls_dir` or `<run dir>/tls`; existing ones are reused (a resumed run).
    Returns what was created, for the launcher's message."""
    security = config.security
    if security.mode == "plaintext":
        return []
    folder = security.folder(config.run.dir)
    created = ensure_certificates(folder, security.hosts, name=config.run.name)
    if security.mode == "token":
        created += [f"{role} token" for role in ensure_tokens(folder)]
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
