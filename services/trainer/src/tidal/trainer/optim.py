"""Optimizer and learning-rate schedule from `OptimConfig`.

Decisions:
- torch's own AdamW and SGD, over two parameter groups: weight decay on matrices only,
  never on 1-D parameters (norm scales, biases), as is usual for transformers.
- The schedule is a pure function `lr_factor(k)` of the number of steps already taken
  (k = 0 at step 1), wrapped in torch's `LambdaLR` so its position is part of the
  optimizer-side state that checkpoints save and restore. Warmup is linear from
  1/warmup_steps up to 1 (never 0: a zero-lr first step would waste the batch); after
  warmup the factor stays 1 (constant) or decays over `decay_steps` to `min_lr_ratio`
  (cosine or linear), then holds the floor.
- SFT steps of an RL run (`sft_lr`) use the same factor with a different peak: the
  trainer scales the group lr for that one step; `LambdaLR.step()` recomputes it from
  the base lr afterwards, so the override never leaks into the next step.
- AdamW runs torch's fused kernel (`fused=True`) whenever every parameter is a plain
  (unsharded) floating tensor on CPU or CUDA: one kernel over all parameters instead of
  ~10 element-wise ops per parameter; measured 3.2x faster on the 4.2M-parameter RL
  shape on one AVX2 core (26 ms against 83 ms a step, issue 19). The update is the same
  formula (parity test: tests/unit/trainer/test_optim.py); sharded (DTensor) parameters
  keep the default implementation.
- `optim_cpu_offload` / `optim_offload = "disk"` swap in `OffloadedOptimizer`
  (`optim_offload.py`): the same update, states in host memory or memory-mapped files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from tidal.trainer.config import OptimConfig, ScheduleConfig
from tidal.trainer.optim_offload import OffloadedOptimizer, optimizer_store


def lr_factor(k: int, schedule: ScheduleConfig) -> float:
    """Multiplier of the peak lr after `k` completed steps."""
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
    store = optimizer_store(config.optim_cpu_offload, config.optim_offload)
    if store is not None:
        return OffloadedOptimizer(
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
