"""`lazy_zeros`: a zero-filled KV cache whose pages are touched only when used.

Decision: `torch.zeros` on CPU allocates, then writes every byte, so the default 1 GiB
KV cache cost ~0.5 s of CPU (and 1 GiB of resident memory) when the first weights
loaded, on every run's start-up path (docs/benchmarks/startup.md), though a small
run uses a few blocks. An anonymous `mmap` is zero-filled by the kernel, page by page,
at first touch: the same zeros (bit for bit, in any dtype), page-aligned, paid for as
blocks fill. On a GPU (`device` not CPU) the ordinary `torch.zeros` is used.

The trade: memory is committed as the cache fills, not up front, so a host without the
budget fails when it fills rather than at load (Linux overcommits anonymous mappings
either way, so `torch.zeros` was no guarantee either once pages could be swapped).
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch


def lazy_zeros(shape: tuple[int, ...], *, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """A tensor of zeros; on CPU backed by an anonymous mapping (zero pages on demand)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    memory = mmap.mmap(-1, nbytes)  # the tensor keeps the mapping alive (torch.frombuffer)
    return torch.frombuffer(memory, dtype=torch.uint8).view(dtype).view(shape)
