"""`python -m tidal.common.grpc.health_probe --address HOST:PORT --role ROLE`: container probe.

Exit 0 iff the health service answers SERVING, 1 with one line otherwise, 2 for a bad
invocation. It dials as its service does, with the security the `TIDAL_SECURITY__*`
variables give, over a plain channel with one attempt (docs/deployment.md, "Images").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from grpc_health.v1 import health_pb2, health_pb2_grpc

import grpc
from tidal.common.config.loading import ENV_PREFIX, load_config
from tidal.common.config.shared import SharedConfig
from tidal.common.errors import ConfigError
from tidal.common.security.credentials import ROLES
from tidal.common.security.transport import TransportSecurity

_SECTIONS = ("SECURITY__", "RUN__")


def security_from_env(role: str, environ: Mapping[str, str]) -> TransportSecurity:
    """ROLE's transport security from the `TIDAL_SECURITY__*`/`TIDAL_RUN__*` variables."""
    kept = {
        k: v for k, v in environ.items() if k.startswith(tuple(ENV_PREFIX + s for s in _SECTIONS))
    }
    config, _ = load_config(SharedConfig, [], environ=kept)
    return TransportSecurity.from_config(config.security, role, config.run.dir)


def probe(address: str, security: TransportSecurity, timeout_s: float) -> str:
    """The serving status's name ("SERVING", "NOT_SERVING", ...); raises grpc.RpcError."""
    security.check_address(address, "dial")
    credentials = security.channel_credentials()
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=timeout_s
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tidal.common.grpc.health_probe",
        description="Exit 0 iff the gRPC health service at --address answers SERVING.",
    )
    parser.add_argument("--address", required=True, help="HOST:PORT to probe")
    parser.add_argument(
        "--role", required=True, choices=ROLES, help="whose certificate/token to present"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=3.0, help="deadline of the whole check (seconds)"
    )
    return parser


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    opts = _parser().parse_args(list(argv))
    if opts.timeout_s <= 0:
        print("error: --timeout-s must be > 0", file=sys.stderr)
        return 2
    try:
        security = security_from_env(opts.role, os.environ if environ is None else environ)
        status = probe(opts.address, security, opts.timeout_s)
    except (ConfigError, ValueError) as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        print(
            f"unhealthy: {opts.address}: {code}: " + " ".join(str(details).split()), file=sys.stderr
        )
        return 1
    if status != "SERVING":
        print(f"unhealthy: {opts.address} answers {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
