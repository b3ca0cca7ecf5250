"""One torchrun rank's view of the job: process groups, mesh, and how the model is wrapped.

`TorchrunRanks` is the many-rank `RankContext` (ranks.py): it starts the process group,
builds the mesh once and a gloo control group (host traffic that never times out while
waiting for a step), shards experts then the model with FSDP, all-reduces counts and
metric sums, and runs context-parallel forwards. Every rank meets the others at a
monitored barrier before tearing the process groups down, since gloo may otherwise abort.
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
from tidal.trainer.parallel.cp_batch import shard_for_cp
from tidal.trainer.parallel.dims import ParallelDims
from tidal.trainer.parallel.ep import check_expert_model, finish_expert_grads, shard_experts
from tidal.trainer.parallel.fsdp import apply_fsdp, fsdp_mesh, grad_sum_factor
from tidal.trainer.parallel.grad_norm import clip_grad_norm
from tidal.trainer.parallel_config import check_parallel
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
            cpu_offload=self.config.model.fsdp_cpu_offload,
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
