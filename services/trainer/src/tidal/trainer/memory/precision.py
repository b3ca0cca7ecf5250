"""What `trainer.precision` resolves to, in one place the trainer and the planner read.

torch-free at import: the memory planner resolves a run's precision from its config without
building the model (only a CPU plan probes the CPU, and that imports torch lazily).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

AUTO_BF16_MIN_PARAMS = 2_000_000
"""`precision = "auto"` keeps fp32 below this many parameters even where bf16 is native:
autocast's per-step weight casts cost more than its matmuls save on tiny models
(docs/benchmarks/trainer_profile.md)."""


def resolve_precision(precision: str, device: torch.device, params: int) -> bool:
    """Whether the step computes under bf16 autocast; "auto" asks the device and logs why."""
    from tidal.models.device import native_bf16

    if precision != "auto":
        return precision == "bf16"
    native, reason = native_bf16(device)
    if native and params < AUTO_BF16_MIN_PARAMS:
        native, reason = False, f"{params:,} parameters, under {AUTO_BF16_MIN_PARAMS:,}"
    log.info("trainer.precision auto: %s on %s (%s)", "bf16" if native else "fp32", device, reason)
    return native


def warn_if_bf16_is_slow(precision: str, param_dtype: str, device: torch.device) -> None:
    """Warn, with the measured cost, when bf16 is asked for on a CPU without native bf16.

    The request is honoured (it may be deliberate, e.g. to match a GPU run's rounding);
    the fp32 default is what such a CPU should run.
    """
    from tidal.models.cpu_features import bf16_cost_warning

    if device.type != "cpu":
        return
    asks = [f"trainer.precision = {precision!r}"] if precision == "bf16" else []
    if param_dtype == "bfloat16":
        asks.append("trainer.parallel.param_dtype = 'bfloat16'")
    if asks and (warning := bf16_cost_warning(" and ".join(asks))):
        log.warning(warning)
