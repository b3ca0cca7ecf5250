"""`is_dtensor`: whether a tensor is a DTensor, without importing DTensor.

Decision: `torch.distributed.tensor` pulls in sympy (~0.7 s of CPU), and a one-process
trainer or an inference replica never makes a DTensor, yet both imported the module
for `isinstance` checks alone: every run's start-up paid it. A DTensor can exist only
once something (FSDP, expert parallelism, DCP) has imported the module, so the check
looks it up in `sys.modules` and is False while it is absent. It may be there but still
importing (the trainer imports DCP on a thread at start-up): then `DTensor` may not be
defined yet, and no DTensor can exist either.
"""

from __future__ import annotations

import sys
from typing import Any


def is_dtensor(value: Any) -> bool:
    """Whether `value` is a `torch.distributed.tensor.DTensor`."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and isinstance(value, dtensor)
