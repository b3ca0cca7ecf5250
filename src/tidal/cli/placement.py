"""`[deployment]`: which visible GPUs the local stack's inference and trainer get.

Inference first, then the trainer, as contiguous ranges of the visible devices, each passed
as CUDA_VISIBLE_DEVICES; the trainer's share is its torchrun world size. GPUs are counted
from the driver's /proc listing, not torch, so `--help` stays instant
(docs/distributed.md, "GPU placement").
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
