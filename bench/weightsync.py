"""Weight sync end to end: trainer publish call → an inference process serves the weights.

For each data path (filesystem, broadcast, stream) and each size (about 100 MB and 1 GB
of bf16 Llama weights), three processes run as in a real deployment: the weight-sync
service (`python -m tidal.weightsync`, configured for the path), an inference replica
(this script with `replica`: the native engine behind the real `WeightWatcher`, bf16)
and this process as the trainer (the real `WeightPublisher`). A timed version starts at
the publish call and ends when the replica reports the engine serves it (clocks are
`time.monotonic`, CLOCK_MONOTONIC, shared by processes on one Linux host). Version 0 is
a warm-up (the replica builds its model; the broadcast group forms).

Lower bounds, measured in the same run on the same bytes (the safetensors payload):
- broadcast and stream: one in-memory copy (`Tensor.copy_`);
- filesystem: write + fsync + read back of one file in the same folder.
The summary's `<path>_fraction_of_bound` is bound / end-to-end at the largest size.

`python bench/weightsync.py [--sizes 100MB,1GB] [--repeats 3]`
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import print_table, write_result

from tidal.trainer.models.llama.model import LlamaArgs, LlamaForCausalLM

LAYERS = {"100MB": 1, "1GB": 11}  # dim 2048, ffn 5632: ~45M params (90 MB bf16) a layer
PATHS = ("filesystem", "broadcast", "stream")


def llama(n_layers: int) -> LlamaArgs:
    return LlamaArgs(
        vocab_size=264,
        dim=2048,
        n_layers=n_layers,
        n_heads=16,
        n_kv_heads=4,
        ffn_dim=5632,
        max_seq_len=64,
    )


def make_weights(args: LlamaArgs) -> dict[str, torch.Tensor]:
    """bf16 weights of the model's shapes (published without the tied head)."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(args).state_dict().items()}
    shapes.pop("lm_head.weight", None)
    g = torch.Generator().manual_seed(0)
    return {
        k: torch.rand(s, generator=g, dtype=torch.float32).to(torch.bfloat16)
        for k, s in shapes.items()
    }


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def copy_bound(size: int, repeats: int) -> float:
    src = torch.empty(size, dtype=torch.uint8).fill_(7)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def file_bound(folder: Path, size: int, repeats: int) -> float:
    data = bytes(size)
    times = []
    for i in range(repeats):
        path = folder / f"bound-{i}.bin"
        started = time.perf_counter()
        with path.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _ = path.read_bytes()
        times.append(time.perf_counter() - started)
        path.unlink()
    return statistics.median(times)


async def run_replica(address: str) -> None:
    """The inference side: print `loaded <version> <monotonic time>` as each is served."""
    from tidal.inference.config import InferenceConfig
    from tidal.inference.native import NativeEngine
    from tidal.inference.weights import WeightWatcher
    from tidal.weightsync.client import WeightSyncClient

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

    watcher = WeightWatcher(WeightSyncClient(address), engine, "bench-replica", on_loaded=on_loaded)
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


async def time_path(
    path: str, args: LlamaArgs, state: dict[str, torch.Tensor], repeats: int, work: Path
) -> list[float]:
    """End-to-end seconds of `repeats` versions published by `path` (after a warm-up)."""
    from tidal.trainer.publisher import WeightPublisher
    from tidal.weightsync.client import WeightSyncClient

    address = f"127.0.0.1:{free_port()}"
    run = ["--run.output-dir", str(work), "--run.name", path, "--endpoints.weightsync", address]
    service = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.weightsync", *run,
        "--weightsync.transport.type", path, "--telemetry.traces-file", "false",
        "--telemetry.log-level", "WARNING",
    )  # fmt: skip
    replica = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "replica", "--address", address, stdout=asyncio.subprocess.PIPE
    )
    client = WeightSyncClient(address)
    try:
        await wait_ready(client)
        publisher = WeightPublisher(work / path / "weights", client, args.to_hf_config())
        seconds = []
        assert replica.stdout is not None
        for version in range(repeats + 1):
            state["model.norm.weight"][0] = version  # each version differs
            started = time.monotonic()
            await publisher.publish(version, state)
            line = (await asyncio.wait_for(replica.stdout.readline(), 600)).decode().split()
            assert line[:2] == ["loaded", str(version)], line
            if version == 0 and path == "broadcast":
                assert await asyncio.wait_for(publisher.broadcast_ready(), 120)
            elif version > 0:
                seconds.append(float(line[2]) - started)
        return seconds
    finally:
        await client.close()
        for process in (replica, service):
            process.terminate()
            await process.wait()


async def run_bench(sizes: list[str], repeats: int) -> None:
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-ws-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        for size in sizes:
            args = llama(LAYERS[size])
            state = make_weights(args)
            total = nbytes(state)
            copy_s = copy_bound(total, repeats)
            file_s = file_bound(work, total, repeats)
            for path in PATHS:
                times = await time_path(path, args, state, repeats, work / size)
                median = statistics.median(times)
                bound = file_s if path == "filesystem" else copy_s
                rows.append(
                    {
                        "size": size,
                        "path": path,
                        "bytes": total,
                        "end_to_end_s": median,
                        "bound": "write+fsync+read" if path == "filesystem" else "memory copy",
                        "bound_s": bound,
                        "fraction_of_bound": bound / median,
                        "GB/s": total / median / 1e9,
                        "runs": len(times),
                    }
                )
                summary[f"{path}_fraction_of_bound"] = bound / median  # the last size wins
                summary[f"{path}_{size}_s"] = median
            summary[f"copy_{size}_s"] = copy_s
            summary[f"write_read_{size}_s"] = file_s
            del state
    summary["size_of_fractions"] = sizes[-1]
    print_table("weight sync: publish → replica serves (median seconds)", rows)
    out = write_result(
        "weightsync",
        config={"sizes": sizes, "repeats": repeats, "layers": {s: LAYERS[s] for s in sizes}},
        results=rows,
        summary=summary,
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "replica"])
    parser.add_argument("--address", default="")
    parser.add_argument("--sizes", default="100MB,1GB")
    parser.add_argument("--repeats", type=int, default=2)
    ns = parser.parse_args()
    if ns.mode == "replica":
        asyncio.run(run_replica(ns.address))
    else:
        asyncio.run(run_bench(ns.sizes.split(","), ns.repeats))


if __name__ == "__main__":
    main()
