"""DTensor helpers that never import DTensor: `is_dtensor`, this rank's shard, the whole tensor.

`torch.distributed.tensor` pulls in sympy, and a one-process trainer or an inference
replica never makes a DTensor, so importing it for `isinstance` alone would slow every
start-up. A DTensor can exist only once something (FSDP, expert parallelism, DCP) has
imported the module, so the check looks it up in `sys.modules`; while it is absent, or
still importing (`DTensor` not defined yet), no DTensor can exist either.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def is_dtensor(value: Any) -> bool:
    """Whether `value` is a `torch.distributed.tensor.DTensor`."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and isinstance(value, dtensor)


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view sharing its storage); a plain tensor as is."""
    return t.to_local() if is_dtensor(t) else t  # type: ignore[no-any-return,attr-defined]


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a sharded DTensor gathered (a collective), a plain one as is."""
    return t.full_tensor() if is_dtensor(t) else t  # type: ignore[no-any-return,attr-defined]
