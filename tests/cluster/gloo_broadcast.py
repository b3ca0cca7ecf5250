"""Bare gloo broadcast of N bytes from rank 0, the reference for the broadcast weight
transport across nodes (run by torchrun, one rank per node). Rank 0 prints one JSON line:
the median seconds of `--repeats` broadcasts after one untimed warm-up.

    torchrun --nnodes 2 ... gloo_broadcast.py --bytes 4000000 --repeats 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    buffer = torch.zeros(args.bytes, dtype=torch.uint8)  # (bytes,)
    dist.broadcast(buffer, src=0)  # warm-up: connections made
    times = []
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.broadcast(buffer, src=0)
        dist.barrier()
        times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(json.dumps({"bytes": args.bytes, "median_s": statistics.median(times)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
