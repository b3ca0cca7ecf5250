"""Where a service's model runs and in which dtype: one answer for trainer and inference.

`resolve_device` makes a `<service>.device` setting concrete for a process that is one of
`local_ranks` on its host: each rank takes its own GPU, so with fewer GPUs than ranks
"auto" falls back to the CPU (saying so) and "cuda" is a `ConfigError`, instead of a rank
dying with "invalid device ordinal". `native_bf16` answers the "auto" dtype settings.
The torch-free orchestrator never imports this module.
"""

from __future__ import annotations

import logging

import torch

from tidal.common.errors import ConfigError
from tidal.models.cpu_features import bf16_support

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str, *, service: str, local_ranks: int = 1) -> torch.device:
    """`<service>.device = name` made concrete on this host (no GPU index: see LOCAL_RANK)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return torch.device(pick_device(name, service=service, gpus=gpus, local_ranks=local_ranks))


def pick_device(name: str, *, service: str, gpus: int, local_ranks: int) -> str:
    """ "cuda" or "cpu" for `<service>.device = name` given the host's GPUs and local ranks."""
    if name == "cpu":
        return name
    if gpus >= local_ranks:
        return "cuda" if gpus else "cpu"
    if name == "cuda":
        advice = (
            f": lower {service}.world_size (or the ranks per node) to the GPU count, or set "
            f'{service}.device = "cpu"'
            if local_ranks > 1
            else f'; set {service}.device = "auto" or "cpu"'
        )
        raise ConfigError(
            f"{service}.device is 'cuda' but this host has {gpus} GPU(s) for {local_ranks} "
            f"{service} rank(s) (one GPU each){advice}"
        )
    if gpus:
        log.warning(
            "%s.device = 'auto': %d %s ranks on this host but %d GPU(s), so the %s runs on "
            "the CPU; set %s.world_size to at most %d to use the GPUs",
            service, local_ranks, service, gpus, service, service, gpus,
        )  # fmt: skip
    return "cpu"


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """(bf16 compute is native on `device`, why in words) for the "auto" dtype settings."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return True, "the GPU computes bf16"
        return False, "the GPU lacks bf16"
    support = bf16_support()
    return support.native, support.reason
