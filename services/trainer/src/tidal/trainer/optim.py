"""Optimizer and learning-rate schedule from `OptimConfig`.

torch's own AdamW and SGD, weight decay on matrices only (never on norms and biases),
or the same update with states off the device (`memory/optim_state_offload.py`). AdamW runs
torch's fused kernel whenever every parameter is a plain tensor on one CPU or CUDA
device. The schedule is a pure function of the steps already taken, wrapped in
`LambdaLR` so its position is part of the optimizer state checkpoints save.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from tidal.trainer.config import OptimConfig, ScheduleConfig
from tidal.trainer.memory.optim_state_offload import OffloadedStateOptimizer, optimizer_state_store


def lr_factor(k: int, schedule: ScheduleConfig) -> float:
    """Multiplier of the peak lr after `k` completed steps: linear warmup from
    1/warmup_steps (never 0: a zero-lr first step would waste its batch), then constant
    or a cosine/linear decay over `decay_steps` to `min_lr_ratio`, which it then holds."""
    if k < schedule.warmup_steps:
        return (k + 1) / schedule.warmup_steps
    if schedule.decay == "constant" or schedule.decay_steps is None:
        return 1.0
    progress = min(1.0, (k - schedule.warmup_steps) / schedule.decay_steps)
    floor = schedule.min_lr_ratio
    if schedule.decay == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - (1.0 - floor) * progress  # linear


def fusable(params: list[torch.nn.Parameter]) -> bool | None:
    """True when torch's fused AdamW can take every parameter (plain floating tensors on
    one CPU or CUDA device); None (torch's default choice) otherwise."""
    if not params:
        return None
    devices = {p.device for p in params}
    plain = all(type(p) is torch.nn.Parameter and p.is_floating_point() for p in params)
    if plain and len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda"):
        return True
    return None


def build_optimizer(
    parameters: Iterable[torch.nn.Parameter], config: OptimConfig
) -> torch.optim.Optimizer:
    """AdamW or SGD with decay on >= 2-D parameters only."""
    params = list(parameters)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    store = optimizer_state_store(config.optim_cpu_offload, config.optim_offload)
    if store is not None:
        return OffloadedStateOptimizer(
            groups,
            kind=config.type,
            store=store,
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            momentum=config.momentum,
            buffer_mb=config.optim_offload_buffer_mb,
            directory=config.optim_offload_dir,
        )
    if config.type == "adamw":
        return torch.optim.AdamW(
            groups,
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            fused=fusable(params) if config.fused_adamw else None,
        )
    if config.type == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    raise ValueError(f"unknown optimizer {config.type!r}; supported: adamw, sgd")


def build_scheduler(
    optimizer: torch.optim.Optimizer, schedule: ScheduleConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR whose factor at `last_epoch = k` is `lr_factor(k)`."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: lr_factor(k, schedule))
