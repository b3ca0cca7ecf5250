"""Weight sync end to end: trainer publish call → an inference process serves the weights.

For each data path (filesystem, broadcast, stream) and each size (about 100 MB and 1 GB
of bf16 Llama weights), three processes run as in a real deployment: the weight-sync
service (`python -m tidal.weightsync`, configured for the path), an inference replica
(this script with `replica`: the native engine behind the real `WeightWatcher`, bf16)
and this process as the trainer (the real `WeightPublisher`). A timed version starts at
the publish call and ends when the replica reports the engine serves it (clocks are
`time.monotonic`, CLOCK_MONOTONIC, shared by processes on one Linux host). Version 0 is
a warm-up (the replica builds its model; the broadcast group forms); the broadcast path
also publishes version 1 untimed (its first broadcast maps the replica's receive buffer,
kept for every later version: a one-time cost of a run, like building the model).

The three stacks run side by side and versions are published round-robin (filesystem,
broadcast, stream, filesystem, ...), with the references measured between rounds, so
every ratio compares figures taken under the same load; each cell is a median.

Lower bounds, measured in the same run on the same number of bytes:
- broadcast and stream: one in-memory copy (`Tensor.copy_`);
- filesystem: write + fsync + read back of one file in the same folder.
Achievable references (the bare transport, nothing else done), also in the same run:
- broadcast: a bare gloo broadcast between two processes in the path's bucket size;
- stream: a bare gRPC server stream between two processes in the path's chunk size
  (raw bytes, no protobuf, no disk, no hashing).
The summary's `<path>_fraction_of_bound` is bound / end-to-end at the largest size, and
`<path>_fraction_of_transport` is bare transport / end-to-end.

`python bench/weightsync.py [--sizes 100MB,1GB] [--repeats 3] [--paths broadcast,stream]`
(`--paths` runs a subset of the stacks, e.g. to profile one path alone).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import print_table, write_result

from tidal.cli.ports import free_port
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM
from tidal.weightsync.config import BroadcastTransport, WeightSyncConfig

LAYERS = {"100MB": 1, "1GB": 11}  # dim 2048, ffn 5632: ~45M params (90 MB bf16) a layer
PATHS = ("filesystem", "broadcast", "stream")


def llama(n_layers: int) -> DecoderArgs:
    return DecoderArgs(
        vocab_size=264,
        dim=2048,
        n_layers=n_layers,
        n_heads=16,
        n_kv_heads=4,
        ffn_dim=5632,
        max_seq_len=64,
    )


def make_weights(args: DecoderArgs) -> dict[str, torch.Tensor]:
    """bf16 weights of the model's shapes (published without the tied head)."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in DecoderLM(args).state_dict().items()}
    shapes.pop("lm_head.weight", None)
    g = torch.Generator().manual_seed(0)
    return {
        k: torch.rand(s, generator=g, dtype=torch.float32).to(torch.bfloat16)
        for k, s in shapes.items()
    }


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def copy_bound(size: int) -> float:
    """One in-memory copy of `size` bytes (warm buffers)."""
    src = torch.empty(size, dtype=torch.uint8).fill_(7)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of the pages
    started = time.perf_counter()
    dst.copy_(src)
    return time.perf_counter() - started


def file_bound(folder: Path, size: int) -> float:
    """Write + fsync + read back of one file of `size` bytes."""
    data = bytes(size)
    path = folder / "bound.bin"
    started = time.perf_counter()
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    _ = path.read_bytes()
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


BARE_METHOD = "/bench.Bytes/Stream"


async def serve_bytes(port: int) -> None:
    """Bare gRPC source: streams `size` raw bytes in `chunk`-byte messages (no protobuf)."""
    import grpc

    async def stream(request: bytes, context: Any) -> Any:
        size, chunk = (int(x) for x in request.decode().split())
        data = memoryview(bytes(size))
        for offset in range(0, size, chunk):
            yield bytes(data[offset : offset + chunk])

    handler = grpc.method_handlers_generic_handler(
        "bench.Bytes", {"Stream": grpc.unary_stream_rpc_method_handler(stream)}
    )
    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
]


async def bare_grpc(address: str, size: int, chunk: int) -> float:
    """Seconds to receive `size` bytes over a bare gRPC stream into one buffer."""
    import grpc

    async with grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        call = channel.unary_stream(BARE_METHOD)
        buffer = bytearray(size)
        torch.frombuffer(buffer, dtype=torch.uint8).fill_(1)  # pages touched before timing
        view = memoryview(buffer)
        started = time.perf_counter()
        offset = 0
        async for data in call(f"{size} {chunk}".encode(), wait_for_ready=True):
            view[offset : offset + len(data)] = data
            offset += len(data)
        seconds = time.perf_counter() - started
    assert offset == size
    return seconds


def gloo_peer(store_address: str, size: int, bucket: int, rounds: int) -> None:
    """Rank 1 of the bare gloo reference: receive `rounds` broadcasts, then leave."""
    import torch.distributed as dist

    host, _, port = store_address.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False)
    pg = dist.ProcessGroupGloo(store, 1, 2, timedelta(seconds=600))
    flat = torch.empty(size, dtype=torch.uint8)
    for _ in range(rounds):
        _gloo_round(pg, flat, bucket)


def _gloo_round(pg: Any, flat: torch.Tensor, bucket: int) -> None:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    works = [pg.broadcast([flat[i : i + bucket]], options) for i in range(0, flat.numel(), bucket)]
    for work in works:
        work.wait()
    pg.barrier().wait()  # the receiver has everything


async def run_replica(address: str) -> None:
    """The inference side: print `loaded <version> <monotonic time>` as each is served."""
    from tidal.inference.config import InferenceConfig
    from tidal.inference.native import NativeEngine
    from tidal.inference.reload import WeightWatcher
    from tidal.weights.client import WeightSyncClient

    engine = NativeEngine(
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        max_batch_size=1,
        max_queue=1,
        max_step_tokens=InferenceConfig().max_step_tokens,
        kv_cache_mb=InferenceConfig().kv_cache_mb,
    )
    await engine.start()

    async def on_loaded(version: int) -> None:
        print(f"loaded {version} {time.monotonic()}", flush=True)

    watcher = WeightWatcher(
        WeightSyncClient(address, security=PLAINTEXT_LOOPBACK),
        engine,
        "bench-replica",
        on_loaded=on_loaded,
    )
    await watcher.run()


async def wait_ready(client: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.list_versions(timeout=2.0)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class Stack:
    """One path's weight-sync service and replica processes, and the trainer's publisher."""

    def __init__(self, path: str, args: DecoderArgs, work: Path) -> None:
        self.path, self.args, self.work = path, args, work
        self.address = f"127.0.0.1:{free_port()}"
        self.version = 0

    async def start(self, state: dict[str, torch.Tensor]) -> None:
        from tidal.trainer.persistence.publisher import WeightPublisher
        from tidal.weights.client import WeightSyncClient

        run = ["--run.output-dir", str(self.work), "--run.name", self.path,
               "--endpoints.weightsync", self.address]  # fmt: skip
        self.service = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tidal.weightsync", *run,
            "--weightsync.transport.type", self.path, "--telemetry.traces-file", "false",
            "--telemetry.log-level", "WARNING",
            "--security.mode", "plaintext",  # loopback; this measures the weight paths
        )  # fmt: skip
        self.replica = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "replica", "--address", self.address,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self.client = WeightSyncClient(self.address, security=PLAINTEXT_LOOPBACK)
        await wait_ready(self.client)
        root = self.work / self.path / "weights"
        self.publisher = WeightPublisher(root, self.client, self.args.to_hf_config())
        await self.publish(state)  # warm-up: the replica builds its model, the group forms
        # warm-up: until retention leaves the spare weights file that every later upload of
        # a run writes over (only a run's first `keep_last` versions write new files)
        if self.path == "stream":
            for _ in range(WeightSyncConfig().keep_last):
                await self.publish(state)
        if self.path == "broadcast":
            assert await asyncio.wait_for(self.publisher.transport_ready(), 120)
            await self.publish(state)  # warm-up: the replica's receive buffer is mapped

    async def publish(self, state: dict[str, torch.Tensor]) -> float:
        """Seconds from the publish call until the replica serves the new version."""
        version = self.version
        self.version += 1
        state["model.norm.weight"][0] = version  # each version differs
        started = time.monotonic()
        await self.publisher.publish(version, state)
        assert self.replica.stdout is not None
        line = (await asyncio.wait_for(self.replica.stdout.readline(), 600)).decode().split()
        assert line[:2] == ["loaded", str(version)], line
        return float(line[2]) - started

    async def close(self) -> None:
        await self.client.close()
        for process in (self.replica, self.service):
            process.terminate()
            await process.wait()


class References:
    """The bare transports' peer processes (a gRPC byte source, a gloo rank 1)."""

    def __init__(self, size: int, rounds: int) -> None:
        self.size, self.rounds = size, rounds
        self.grpc_address = f"127.0.0.1:{free_port()}"

    async def start(self) -> None:
        import torch.distributed as dist

        port = self.grpc_address.rpartition(":")[2]
        self.source = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "grpc-source", "--address", port
        )
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.peer = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "gloo-peer", "--address", f"127.0.0.1:{self.store.port}",
            "--bytes", str(self.size), "--rounds", str(self.rounds),
        )  # fmt: skip
        self.pg = await asyncio.to_thread(
            dist.ProcessGroupGloo, self.store, 0, 2, timedelta(seconds=600)
        )
        self.flat = torch.ones(self.size, dtype=torch.uint8)

    async def gloo(self) -> float:
        started = time.perf_counter()
        await asyncio.to_thread(_gloo_round, self.pg, self.flat, BUCKET_BYTES)
        return time.perf_counter() - started

    async def grpc(self) -> float:
        return await bare_grpc(self.grpc_address, self.size, CHUNK_BYTES)

    async def close(self) -> None:
        await self.peer.wait()
        self.source.terminate()
        await self.source.wait()


BUCKET_BYTES = BroadcastTransport().bucket_bytes
CHUNK_BYTES = WeightSyncConfig().chunk_bytes


async def measure_size(
    size: str, repeats: int, work: Path, paths: tuple[str, ...] = PATHS
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One size: the stacks and the references, interleaved round by round."""
    args = llama(LAYERS[size])
    state = make_weights(args)
    total = nbytes(state)
    stacks = {path: Stack(path, args, work / size) for path in paths}
    refs = References(total, repeats)
    times: dict[str, list[float]] = {k: [] for k in (*paths, "copy", "file", "gloo", "grpc")}
    try:
        for stack in stacks.values():
            await stack.start(state)
        await refs.start()
        for _ in range(repeats):
            for path, stack in stacks.items():
                times[path].append(await stack.publish(state))
            times["copy"].append(copy_bound(total))
            times["file"].append(file_bound(work, total))
            times["gloo"].append(await refs.gloo())
            times["grpc"].append(await refs.grpc())
    finally:
        for stack in stacks.values():
            if hasattr(stack, "client"):
                await stack.close()
        await refs.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    transport: dict[str, tuple[str, float | None]] = {
        "broadcast": ("bare gloo", med["gloo"]),
        "stream": ("bare gRPC", med["grpc"]),
    }
    rows = []
    for path in paths:
        bound_name, bound = ("write+fsync+read", med["file"]) if path == "filesystem" else (
            "memory copy", med["copy"])  # fmt: skip
        ref_name, ref = transport.get(path, ("", None))
        rows.append(
            {
                "size": size,
                "path": path,
                "bytes": total,
                "end_to_end_s": med[path],
                "bound": bound_name,
                "bound_s": bound,
                "fraction_of_bound": bound / med[path],
                "transport": ref_name,
                "transport_s": ref,
                "fraction_of_transport": None if ref is None else ref / med[path],
                "GB/s": total / med[path] / 1e9,
                "runs": len(times[path]),
            }
        )
    return rows, med


async def run_bench(sizes: list[str], repeats: int, paths: tuple[str, ...] = PATHS) -> None:
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"loadavg_before": Path("/proc/loadavg").read_text().split()[:3]}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-ws-", dir=os.environ.get("TMPDIR")) as tmp:
        for size in sizes:
            size_rows, med = await measure_size(size, repeats, Path(tmp), paths)
            rows += size_rows
            for row in size_rows:  # the last size wins the headline fractions
                path = row["path"]
                summary[f"{path}_fraction_of_bound"] = row["fraction_of_bound"]
                summary[f"{path}_{size}_s"] = row["end_to_end_s"]
                if row["transport"]:
                    summary[f"{path}_fraction_of_transport"] = row["fraction_of_transport"]
            for key, name in (("copy", "copy"), ("file", "write_read"), ("gloo", "bare_gloo"),
                              ("grpc", "bare_grpc")):  # fmt: skip
                summary[f"{name}_{size}_s"] = med[key]
    summary["size_of_fractions"] = sizes[-1]
    summary["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print_table("weight sync: publish → replica serves (median seconds)", rows)
    out = write_result(
        "weightsync",
        config={
            "sizes": sizes,
            "repeats": repeats,
            "layers": {s: LAYERS[s] for s in sizes},
            "bucket_bytes": BUCKET_BYTES,
            "chunk_bytes": CHUNK_BYTES,
            "interleaved": True,
            "paths": list(paths),
        },
        results=rows,
        summary=summary,
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = ["bench", "replica", "grpc-source", "gloo-peer"]
    parser.add_argument("mode", nargs="?", default="bench", choices=modes)
    parser.add_argument("--address", default="")
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--sizes", default="100MB,1GB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset")
    ns = parser.parse_args()
    if ns.mode == "replica":
        asyncio.run(run_replica(ns.address))
    elif ns.mode == "grpc-source":
        asyncio.run(serve_bytes(int(ns.address)))
    elif ns.mode == "gloo-peer":
        gloo_peer(ns.address, ns.bytes, BUCKET_BYTES, ns.rounds)
    else:
        paths = tuple(ns.paths.split(","))
        unknown = sorted(set(paths) - set(PATHS))
        if unknown:
            parser.error(f"--paths: unknown {unknown}; choose from {list(PATHS)}")
        asyncio.run(run_bench(ns.sizes.split(","), ns.repeats, paths))


if __name__ == "__main__":
    main()
