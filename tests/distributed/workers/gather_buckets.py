"""torchrun worker: pack buckets from a DTensor-sharded state dict on 2 gloo ranks.

Each rank holds only its Shard(0) of every tensor. Both ranks run `iter_packed_buckets`
(the per-tensor gather is a collective); rank 0 lays the buckets into a flat buffer (as a
receiver does) and saves what it got, plus the size of the largest single gather.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from tidal.trainer.torchrun_ranks import leave_process_group
from tidal.weights import buckets
from tidal.weights.buckets import iter_packed_buckets, layout_of, specs_of, tensor_views


def full_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(64, 16, generator=g).to(torch.bfloat16),
        "b": torch.randn(10, 3, generator=g),  # 10 rows: uneven shards
        "c": torch.arange(33, dtype=torch.int64),
    }


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    sharded = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full_state().items()}
    peak = 0
    gather = buckets.gather_full_tensor

    def counting_gather(t: torch.Tensor) -> torch.Tensor:
        nonlocal peak
        full = gather(t)
        peak = max(peak, full.numel() * full.element_size())
        return full

    buckets.gather_full_tensor = counting_gather  # type: ignore[assignment]
    layout = layout_of(specs_of(sharded))
    flat = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    buffers = [torch.empty(300, dtype=torch.uint8) for _ in range(2)]
    packed = iter_packed_buckets(sharded, layout, 300, buffers)
    for (start, stop), bucket in zip(layout.buckets(300), packed, strict=True):
        flat[start:stop].copy_(bucket)
    if dist.get_rank() == 0:
        received = {k: v.clone() for k, v in tensor_views(flat, layout).items()}
        received["peak_gathered_bytes"] = torch.tensor(peak)
        save_file(received, out)
    leave_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
