"""One trainer rank's view of the job: process groups, mesh, and how the model is wrapped.

Decisions:
- `RankContext.init` is called once per torchrun rank, after the config was validated:
  it starts the process group (NCCL on CUDA, gloo on CPU: `parallel.backend = "auto"`),
  builds the named mesh once (`ParallelDims.build_mesh`) and a second, gloo group over
  all ranks for control traffic (rank 0's commands, step counts, metrics), which stays
  on the host whatever the compute backend is and never times out while the trainer
  waits for the next step.
- The `Trainer` takes the context and asks it for three things only: wrap the model
  (`parallelize`: AC → compile → FSDP, in that fixed order), the loss factor that turns
  FSDP's gradient average into the sum (`loss_scale`), and the all-reduce of the step's
  token counts and metric sums (`reduce`). So train_step.py stays one process's story.
- Data parallelism is what is wired today: CP and EP run in the tests of `cp.py` and
  `ep.py`, but the trainer's packed forward and the MoE block do not use them yet, so a
  config asking for them stops here with a clear error rather than training wrongly.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tidal.common.errors import ConfigError
from tidal.trainer.config import TrainerConfig
from tidal.trainer.parallel.config import check_parallel
from tidal.trainer.parallel.dims import ParallelDims
from tidal.trainer.parallel.fsdp import apply_fsdp, fsdp_mesh, grad_sum_factor

CONTROL_TIMEOUT = datetime.timedelta(days=7)  # followers wait this long for rank 0's next step


def rank_device(device: str) -> torch.device:
    """This rank's device: its own GPU (LOCAL_RANK) on CUDA, else the CPU."""
    if device == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(device)


@dataclass
class RankContext:
    config: TrainerConfig
    dims: ParallelDims
    mesh: Any  # DeviceMesh ("dp_replicate", "dp_shard", "cp") + flattened views
    control: Any  # gloo ProcessGroup over all ranks
    device: torch.device

    @classmethod
    def init(cls, config: TrainerConfig, device: str) -> RankContext:
        """Start this rank's process group (collective: every rank calls it)."""
        world = int(os.environ["WORLD_SIZE"])
        if world != config.world_size:
            raise ConfigError(
                f"torchrun started {world} processes but trainer.world_size is {config.world_size}"
            )
        dims = check_parallel(world, config.parallel, config.model)
        if dims.cp > 1 or dims.ep > 1:
            raise ConfigError(
                "trainer.parallel.cp / ep > 1 are not wired into the trainer's forward yet "
                "(parallel/cp.py and parallel/ep.py are tested on their own); use cp = ep = 1"
            )
        backend = config.parallel.backend
        if backend == "auto":
            backend = "nccl" if device == "cuda" else "gloo"
        torch_device = rank_device(device)
        dist.init_process_group(backend)
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        mesh = dims.build_mesh(torch_device.type)
        return cls(config, dims, mesh, control, torch_device)

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return self.dims.world_size

    @property
    def _fsdp_mesh(self) -> Any:
        return fsdp_mesh(self.mesh, hsdp=self.dims.dp_replicate > 1)

    @property
    def loss_scale(self) -> float:
        return float(grad_sum_factor(self._fsdp_mesh))

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Wrap the freshly built model in place; returns it."""
        # Hook for the memory levers (issue 7a): activation checkpointing, then
        # torch.compile, go here, before sharding wraps the blocks.
        p = self.config.parallel
        return apply_fsdp(
            model,
            self._fsdp_mesh,
            param_dtype=p.param_dtype,
            reduce_dtype=p.reduce_dtype,
            reshard_after_forward=p.reshard_after_forward,
            cpu_offload=p.cpu_offload,
        )

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel ranks (host tensors, the gloo control group)."""
        out = t.detach().to("cpu", copy=True)
        dist.all_reduce(out, group=self.control)
        return out.to(t.device)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
