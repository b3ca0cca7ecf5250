"""One torchrun rank's view of the job: process groups, mesh, and how the model is wrapped.

Decisions:
- `TorchrunRanks` is the many-rank `RankContext` (ranks.py; `SingleProcess` is the
  world-size-1 one), so the `Trainer` runs the same code on one rank or many.
- `TorchrunRanks.init` is called once per torchrun rank, after the config was validated:
  it starts the process group (NCCL on CUDA, gloo on CPU: `parallel.backend = "auto"`),
  builds the named mesh once (`ParallelDims.build_mesh`) and a second, gloo group over
  all ranks for control traffic (rank 0's commands, step counts, metrics), which stays
  on the host whatever the compute backend is and never times out while the trainer
  waits for the next step.
- The `Trainer` asks the context to wrap the model (`parallelize`: the levers' AC →
  compile, then FSDP, in that fixed order), for the loss factor that turns FSDP's
  gradient average into the sum (`loss_scale`), and for the all-reduces of the step's
  token counts (`reduce`) and metric sums (`sum_over_ranks`). Its ranks run every
  micro-batch, empty ones too (`runs_empty_micro_batches`): forward and backward are
  collectives over the mesh. So train_step.py stays one process's story.
- Context parallelism: the CP ranks of a data-parallel group get the same micro-batches;
  `cp_logprobs` runs the model on this rank's zigzag share (cp_batch.py) with the ring or
  Ulysses backend. Token counts are then summed over data-parallel ranks only (`reduce`
  divides the all-rank sum by cp), metric sums over all ranks (each CP rank holds part
  of every sample). The "sequence" normalization and GSPO's sequence ratio need whole
  samples on one rank, so config validation refuses them with cp > 1.
- Leaving: every rank meets the others at a barrier before `destroy_process_group`
  (`leave_process_group`). Without it gloo sometimes aborts the process that tears its
  connections down first ("terminate called without an active exception": 2 runs in 15
  of a two-rank job on this machine, none in 30 with the barrier). The barrier is a
  `monitored_barrier` on a gloo group, so a peer that already died costs a logged
  timeout, not a hang.
- Expert parallelism (`ep > 1`): `parallelize` shards the MoE blocks' experts over the
  mesh's "ep" groups before FSDP wraps the rest (ep.py), `finish_gradients`, called
  by the Trainer after the step's last backward, makes their gradients the global sum
  like FSDP's reduce-scatter does for every other parameter, and `clip_grad_norm` takes
  the norm over both meshes (grad_norm.py).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tidal.batch.tensors import MicroBatchData
from tidal.common.errors import ConfigError
from tidal.trainer.config import TrainerConfig
from tidal.trainer.parallel.config import check_parallel
from tidal.trainer.parallel.cp_batch import shard_for_cp
from tidal.trainer.parallel.dims import ParallelDims
from tidal.trainer.parallel.ep import check_expert_model, finish_expert_grads, shard_experts
from tidal.trainer.parallel.fsdp import apply_fsdp, fsdp_mesh, grad_sum_factor
from tidal.trainer.parallel.grad_norm import clip_grad_norm
from tidal.trainer.ranks import Autocast

CONTROL_TIMEOUT = datetime.timedelta(days=7)  # followers wait this long for rank 0's next step


def rank_device(device: str) -> torch.device:
    """This rank's device: its own GPU (LOCAL_RANK) on CUDA, else the CPU."""
    if device == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(device)


@dataclass
class TorchrunRanks:
    """This rank's `RankContext` (ranks.py) in a torchrun job."""

    config: TrainerConfig
    dims: ParallelDims
    mesh: Any  # DeviceMesh ("dp_replicate", "dp_shard_mod_ep", "ep", "cp") + flattened views
    control: Any  # gloo ProcessGroup over all ranks
    device: torch.device

    @classmethod
    def init(cls, config: TrainerConfig, device: str) -> TorchrunRanks:
        """Start this rank's process group (collective: every rank calls it)."""
        world = int(os.environ["WORLD_SIZE"])
        if world != config.world_size:
            raise ConfigError(
                f"torchrun started {world} processes but trainer.world_size is {config.world_size}"
            )
        dims = check_parallel(world, config.parallel, config.model, config.loss)
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
    def cp(self) -> int:
        return self.dims.cp

    @property
    def shards_model(self) -> bool:
        return True

    @property
    def runs_empty_micro_batches(self) -> bool:
        return True  # every forward and backward is a collective over the mesh

    @property
    def _fsdp_mesh(self) -> Any:
        return fsdp_mesh(self.mesh, hsdp=self.dims.dp_replicate > 1)

    @property
    def loss_scale(self) -> float:
        return float(grad_sum_factor(self._fsdp_mesh))

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Shard the model in place; returns it. The Trainer applies the memory levers
        (LoRA, activation checkpointing, compile) before calling this."""
        p = self.config.parallel
        experts: set[nn.Parameter] = set()
        if self.dims.ep > 1:
            check_expert_model(model, self.dims.ep)
            experts = shard_experts(model, self.mesh)
        return apply_fsdp(
            model,
            self._fsdp_mesh,
            ignored_params=experts,
            param_dtype=p.param_dtype,
            reduce_dtype=p.reduce_dtype,
            reshard_after_forward=p.reshard_after_forward,
            cpu_offload=self.config.model.fsdp_cpu_offload,  # the memory lever (issue 7)
        )

    def finish_gradients(self, model: nn.Module) -> None:
        """After the step's last backward: expert gradients become global sums (ep > 1)."""
        if self.dims.ep > 1:
            finish_expert_grads(model, self.mesh, self.loss_scale)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip to the global L2 norm across meshes (expert and dense weights differ)."""
        return clip_grad_norm(model.parameters(), max_norm)

    def sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over every rank (host tensors, the gloo control group)."""
        out = t.detach().to("cpu", copy=True)
        dist.all_reduce(out, group=self.control)
        return out.to(t.device)

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of per-rank step counts over the data-parallel ranks (the CP ranks of a
        group hold the same micro-batches, so the all-rank sum counts them cp times)."""
        return self.sum_over_ranks(t) / self.dims.cp

    def dp_index(self, rank: int) -> int:
        """Which data-parallel share global `rank` trains (cp is the innermost mesh dim)."""
        return rank // self.dims.cp

    def cp_logprobs(
        self, model: nn.Module, batch: MicroBatchData, autocast: Autocast
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """This CP rank's (n, V) log-softmax, (n,) target logprobs, (n,) target index into
        the row and (n,) validity (cp_batch.py)."""
        cp_mesh = self.mesh["cp"]
        shard = shard_for_cp(
            batch,
            cp=self.dims.cp,
            rank=cp_mesh.get_local_rank(),
            style=self.config.parallel.cp_style,
            group=cp_mesh.get_group(),
        )
        with autocast():
            logits = model(shard.input_ids, shard.position_ids, attention=shard.attention)[0]
        logprobs_all = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
        targets = batch.input_ids[shard.target_index]  # (n,)
        logprobs = logprobs_all.gather(-1, targets[:, None]).squeeze(-1)  # (n,)
        return logprobs_all, logprobs, shard.target_index, shard.valid

    def close(self) -> None:
        leave_process_group(self.control)


log = logging.getLogger(__name__)


def leave_process_group(group: dist.ProcessGroup | None = None, timeout_s: float = 60.0) -> None:
    """Wait for every rank (on `group`, a gloo group; the default group if None), then
    destroy all process groups. Safe to call when none was started."""
    if not dist.is_initialized():
        return
    try:
        dist.monitored_barrier(group, timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # a peer died first: tear down anyway
        log.warning("leaving the process group without every rank: %s", exc)
    dist.destroy_process_group()
