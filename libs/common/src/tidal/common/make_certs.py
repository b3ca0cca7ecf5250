"""`tidal certs` (also `python -m tidal.common.make_certs`, which needs only tidal-common,
so any service image can run it): a CA, per-role certificates and optionally per-role
tokens for a deployment. `tidal rl` makes the same files in `<run dir>/tls/` itself; this
is for services started one by one (compose, k8s, SLURM): run it once, then give each
service ca.pem and its own `<role>.pem`/`<role>.key` (docs/operations.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tidal.common.certs import ROLES, ensure_certificates
from tidal.common.security import ensure_tokens


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
