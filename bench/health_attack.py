"""What anonymous oversized health checks cost each server: RSS growth per service.

The health service is open by design (probes must work), so in token mode any caller that
completes the TLS handshake may call `Check`. One process serves a real trainer,
weight-sync service, inference replica and orchestrator server
(tests/helpers/served_trainer.py, token mode); this script sends `--attackers`
concurrent `Check` requests of `--mib` MiB each, without a token, to one server at a
time, and reports each server's peak RSS growth (VmHWM after, less VmRSS before, the
peak reset between servers) and the status codes the calls ended with. The servers share
one process, so memory one attack freed can serve the next one's: `--services` attacks
a subset (one alone gives its own figure).

    .venv/bin/python bench/health_attack.py [--mib 200] [--attackers 4] [--services trainer]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from common import print_table, write_result

from tidal.common.security.credentials import ensure_certificates, ensure_tokens

SERVED = Path(__file__).resolve().parents[1] / "tests" / "helpers" / "served_trainer.py"
SERVICES = ("trainer", "weightsync", "inference", "orchestrator")


def proc_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def check_request(size: int) -> bytes:
    """A HealthCheckRequest whose `service` name is `size` bytes."""
    length = bytearray()
    n = size
    while n > 0x7F:
        length.append(n & 0x7F | 0x80)
        n >>= 7
    length.append(n)
    return b"\x0a" + bytes(length) + b"x" * size


async def attack(address: str, ca: bytes, request: bytes, attackers: int) -> list[str]:
    """The status codes of `attackers` concurrent anonymous Checks carrying `request`."""
    options = [("grpc.max_send_message_length", 2 * len(request))]
    credentials = grpc.ssl_channel_credentials(ca)
    async with grpc.aio.secure_channel(address, credentials, options=options) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes)

        async def one() -> str:
            try:
                await check(request, timeout=60)
            except grpc.aio.AioRpcError as err:
                return err.code().name
            return "OK"

        return list(await asyncio.gather(*(one() for _ in range(attackers))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument(
        "--services", default=",".join(SERVICES), help="comma-separated subset, attacked in order"
    )
    args = parser.parse_args()
    request = check_request(args.mib << 20)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tls = Path(tmp) / "tls"
        ensure_certificates(tls)
        ensure_tokens(tls)
        server = subprocess.Popen(
            [sys.executable, str(SERVED), "token", str(tls), str(Path(tmp) / "run")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            ports = server.stdout.readline().split()
            chosen = args.services.split(",")
            for name, port in zip(SERVICES, ports, strict=True):
                if name not in chosen:
                    continue
                before = proc_kib(server.pid, "VmRSS")
                Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
                started = time.monotonic()
                codes = asyncio.run(
                    attack(
                        f"127.0.0.1:{port}", (tls / "ca.pem").read_bytes(), request, args.attackers
                    )
                )
                growth = (proc_kib(server.pid, "VmHWM") - before) / 1024
                rows.append(
                    {
                        "service": name,
                        "rss_growth_mib": round(growth, 1),
                        "seconds": round(time.monotonic() - started, 2),
                        "codes": ",".join(sorted(set(codes))),
                    }
                )
        finally:
            server.communicate(timeout=60)
    print_table(f"{args.attackers} anonymous {args.mib} MiB health Checks per server", rows)
    write_result(
        "health_attack",
        config={"mib": args.mib, "attackers": args.attackers, "mode": "token"},
        results=rows,
        summary={r["service"] + "_rss_growth_mib": r["rss_growth_mib"] for r in rows},
    )


if __name__ == "__main__":
    main()
