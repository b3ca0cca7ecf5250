"""`[deployment]`: which visible GPUs the local stack's inference and trainer get.

Decisions:
- Inference first, then trainer, as contiguous ranges of the visible devices
  (CUDA_VISIBLE_DEVICES if set, else every GPU the driver lists): with 8 GPUs,
  `num_infer_gpus = 2, num_train_gpus = 6` gives inference 0,1 and the trainer 2-7. Each
  child gets its range as CUDA_VISIBLE_DEVICES, so both see their GPUs from index 0.
- The trainer's share is its torchrun world size: `num_train_gpus > 1` sets
  `trainer.world_size` to it (asking for a different explicit world size is an error).
- Counting GPUs must not import torch (`tidal rl --help` stays instant): the driver's
  `/proc/driver/nvidia/gpus` lists them. On a CPU machine every count must be 0, and
  asking for GPUs fails with the fields named instead of training on the CPU silently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field

from tidal.common.config.loading import BaseConfig
from tidal.common.config.schema import FIRST
from tidal.common.errors import ConfigError

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


class DeploymentConfig(BaseConfig):
    num_infer_gpus: Annotated[int, FIRST] = Field(default=0, ge=0)
    """GPUs for inference (the first visible ones); 0 = inference on its `device` (CPU)."""
    num_train_gpus: Annotated[int, FIRST] = Field(default=0, ge=0)
    """GPUs for the trainer (the ones after inference's); > 1 runs the trainer as a
    torchrun job of that many ranks. 0 = trainer on its `device` (CPU)."""


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """Device ids the children may use: CUDA_VISIBLE_DEVICES, else the driver's GPUs."""
    env = os.environ if environ is None else environ
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d for d in listed.split(",") if d.strip()]
    if NVIDIA_GPUS.is_dir():
        return [str(i) for i in range(len(list(NVIDIA_GPUS.iterdir())))]
    return []


def place(deployment: DeploymentConfig, gpus: list[str]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES per service ("" hides every GPU); ConfigError when short."""
    wanted = deployment.num_infer_gpus + deployment.num_train_gpus
    if wanted > len(gpus):
        raise ConfigError(
            f"deployment.num_infer_gpus + deployment.num_train_gpus = "
            f"{deployment.num_infer_gpus} + {deployment.num_train_gpus} = {wanted}, but "
            f"{len(gpus)} GPU(s) are visible" + ("" if gpus else " (a CPU machine: use 0 and 0)")
        )
    if not wanted:
        return {}
    infer = gpus[: deployment.num_infer_gpus]
    train = gpus[deployment.num_infer_gpus : wanted]
    return {"inference": ",".join(infer), "trainer": ",".join(train)}


def trainer_world_size(
    ranks: int, world_size: int, *, explicit: bool, source: str = "deployment.num_train_gpus"
) -> int:
    """The trainer's world size once `ranks` (from `source`, named in errors) is applied."""
    if ranks <= 1:
        return world_size
    if explicit and world_size not in (1, ranks):
        raise ConfigError(
            f"trainer.world_size = {world_size} but {source} = {ranks}; leave "
            "trainer.world_size unset (it follows) or make them equal"
        )
    return ranks
