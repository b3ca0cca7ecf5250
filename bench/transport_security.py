"""Cost of transport security: a real weight-sync service on loopback in each mode.

Measures, per `security.mode` (plaintext, mtls, token), interleaved round by round so load
drifts hit every mode alike: the median latency of a small unary call (`GetVersion`,
after the channel is connected, so the handshake is not in it), the time to connect a new
channel (TCP + TLS handshake + first call), and the throughput of streaming a version's
files (`FetchWeights`, the stream path: the most bytes any RPC moves).

    .venv/bin/python bench/transport_security.py [--mib 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import print_table, write_result

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.config import SecurityConfig
from tidal.common.security.credentials import ensure_certificates, ensure_tokens
from tidal.common.security.transport import TransportSecurity
from tidal.rpc.v1 import weightsync_pb2 as pb
from tidal.rpc.v1 import weightsync_pb2_grpc as pb_grpc
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import write_version
from tidal.weightsync.config import StreamTransport
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

MODES = ("plaintext", "mtls", "token")


def security(folder: Path, mode: str, role: str) -> TransportSecurity:
    config = SecurityConfig.model_validate({"mode": mode, "tls_dir": str(folder)})
    return TransportSecurity.from_config(config, role, folder)


async def measure(mode: str, tls: Path, root: Path, calls: int) -> dict[str, float]:
    registry = VersionRegistry(root, keep_last=3)
    binding = ServiceBinding(
        WeightSyncServicer(registry, chunk_bytes=1 << 20, transport=StreamTransport()),
        add_to_server,
        "tidal.rpc.v1.WeightSyncService",
    )
    server = GrpcServer(
        "127.0.0.1:0", [binding], GrpcConfig(), security=security(tls, mode, "weightsync")
    )
    await server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        client_security = security(tls, mode, "inference")
        connects = []
        for _ in range(10):
            started = time.perf_counter()
            async with make_channel(address, security=client_security) as channel:
                stub = pb_grpc.WeightSyncServiceStub(channel)
                await stub.GetVersion(pb.GetVersionRequest(version=-1))
            connects.append(time.perf_counter() - started)
        client = WeightSyncClient(address, security=client_security)
        latest = await client.latest()
        assert latest is not None
        latencies = []
        for _ in range(calls):
            started = time.perf_counter()
            await client.stub.GetVersion(pb.GetVersionRequest(version=-1))
            latencies.append(time.perf_counter() - started)
        started = time.perf_counter()
        await client.fetch_files(latest.manifest)
        fetch_s = time.perf_counter() - started
        await client.close()
        mib = latest.manifest.total_bytes / 2**20
        return {
            "connect_ms": statistics.median(connects) * 1e3,
            "unary_ms": statistics.median(latencies) * 1e3,
            "fetch_mib_s": mib / fetch_s,
        }
    finally:
        await server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        tls, root = Path(work) / "tls", Path(work) / "weights"
        ensure_certificates(tls)
        ensure_tokens(tls)
        n = opts.mib * 2**20 // 4
        weights = torch.from_numpy(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
        write_version(root, version=0, step=0, state_dict={"w": weights}, config={})
        results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(opts.rounds):
            for mode in MODES:
                results[mode].append(await measure(mode, tls, root, opts.calls))
    rows = []
    for mode in MODES:
        row: dict[str, object] = {"mode": mode}
        for key in ("connect_ms", "unary_ms", "fetch_mib_s"):
            row[key] = round(statistics.median(r[key] for r in results[mode]), 2)
        rows.append(row)
    print_table(f"transport security, {opts.mib} MiB fetch, median of {opts.rounds}", rows)
    uptime = Path("/proc/loadavg").read_text().split()[0]
    write_result(
        "transport_security",
        config={"mib": opts.mib, "rounds": opts.rounds, "calls": opts.calls},
        results=rows,
        summary={"load_1min_at_end": float(uptime)},
    )


if __name__ == "__main__":
    asyncio.run(main())
