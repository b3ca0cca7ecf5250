"""Rank 0 leads, the other ranks follow: one command stream over the gloo control group.

Only rank 0 serves gRPC, and everything it does with the model is a collective under FSDP
(a step, gathering weights to publish, a DCP save), so it first commands every rank, then
does its part. `TorchrunLeader` is the `ServiceTrainer` of a torchrun job and
`LeaderCheckpoints` its `CheckpointManager`, so the service serves it like one process.
Rank 0 checks the step number before commanding anything, so a refused request never
reaches the followers; an error after the command depends only on the global counts,
happens on every rank alike, and followers log it and wait for the next command.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from tidal.batch.tensors import MicroBatchData
from tidal.common.errors import FailedPrecondition, TidalError
from tidal.trainer.config import TrainerConfig
from tidal.trainer.parallel.assign import shares_by_rank
from tidal.trainer.persistence.checkpoint import CheckpointManager, TrainingState
from tidal.trainer.service_trainer import LossKind
from tidal.trainer.shared_prompts import check_shared_prompts
from tidal.trainer.torchrun_ranks import TorchrunRanks
from tidal.trainer.train_step import Trainer

log = logging.getLogger(__name__)

Op = Literal["train", "publish", "save", "stop"]


@dataclass
class Command:
    op: Op
    step: int = 0
    kind: LossKind = "pg"
    batches: list[MicroBatchData] = field(default_factory=list)  # this rank's share


class ControlChannel:
    def __init__(self, ranks: TorchrunRanks) -> None:
        self.ranks = ranks
        self.group, self.world = ranks.control, ranks.world_size

    def send(self, commands: list[Command]) -> Command:
        """Rank 0: command i goes to rank i; returns rank 0's own."""
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, commands, src=0, group=self.group)
        return mine[0]  # type: ignore[no-any-return]

    def broadcast(self, command: Command) -> Command:
        return self.send([command] * self.world)

    def receive(self) -> Command:
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, None, src=0, group=self.group)
        return mine[0]  # type: ignore[no-any-return]


class TorchrunLeader:
    """Rank 0's `Trainer`: commands the followers, then trains its own share."""

    def __init__(self, trainer: Trainer, channel: ControlChannel) -> None:
        self.trainer, self.channel = trainer, channel

    # Rank 0's own state: reading it involves no other rank.
    @property
    def config(self) -> TrainerConfig:
        return self.trainer.config

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    @property
    def model(self) -> nn.Module:
        return self.trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.trainer.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.trainer.scheduler

    @property
    def trained_step(self) -> int:
        return self.trainer.trained_step

    @trained_step.setter
    def trained_step(self, step: int) -> None:
        self.trainer.trained_step = step

    @property
    def num_parameters(self) -> int:
        return self.trainer.num_parameters

    def describe(self) -> str:
        return self.trainer.describe()

    def hf_config(self) -> dict[str, object]:
        return self.trainer.hf_config()

    def adapter_config(self) -> dict[str, object] | None:
        return self.trainer.adapter_config()

    # Collectives: every rank is commanded first, then rank 0 does its part.

    def train_step(
        self, step: int, batches: list[MicroBatchData], kind: LossKind
    ) -> dict[str, float]:
        if step != self.trainer.trained_step + 1:
            raise FailedPrecondition(
                f"expected step {self.trainer.trained_step + 1}, got step {step}"
            )
        ranks = self.channel.ranks
        check_shared_prompts(batches, self.trainer.config, cp=ranks.cp)  # before any rank runs
        shares = shares_by_rank(batches, ranks.dims.dp)  # CP ranks share their group's
        mine = self.channel.send(
            [
                Command("train", step, kind, shares[ranks.dp_index(r)])
                for r in range(self.channel.world)
            ]
        )
        metrics = self.trainer.train_step(step, mine.batches, kind)
        tokens = sum(b.num_tokens for b in batches)  # the whole step's, not rank 0's share
        metrics.update(
            tokens=float(tokens),
            loss_tokens=float(sum(b.num_loss_tokens for b in batches)),
            tokens_per_s=tokens / metrics["seconds"] if metrics["seconds"] > 0 else 0.0,
        )
        return metrics

    def state_dict_for_publish(self) -> dict[str, torch.Tensor]:
        self.channel.broadcast(Command("publish"))
        return self.trainer.state_dict_for_publish()

    def stop(self) -> None:
        self.channel.broadcast(Command("stop"))


class LeaderCheckpoints(CheckpointManager):
    """Rank 0's checkpoint manager: every rank writes its shards of the same save."""

    def __init__(self, root: Path, *, keep_last: int, channel: ControlChannel) -> None:
        super().__init__(root, keep_last=keep_last)
        self.channel = channel

    def save(self, trainer: TrainingState, *, extra: dict[str, int] | None = None) -> Path:
        self.channel.broadcast(Command("save"))
        return super().save(trainer, extra=extra)


def follow(trainer: Trainer, checkpoints: CheckpointManager, channel: ControlChannel) -> None:
    """A follower rank's life: do what rank 0 commands until it says stop."""
    while True:
        command = channel.receive()
        try:
            if command.op == "stop":
                return
            if command.op == "train":
                trainer.train_step(command.step, command.batches, command.kind)
            elif command.op == "publish":
                trainer.state_dict_for_publish()
            elif command.op == "save":
                checkpoints.save(trainer)
        except TidalError as exc:  # rank 0 hit the same error and answered the caller
            log.warning(
                "rank %d: %s failed alike on every rank: %s", dist.get_rank(), command.op, exc
            )
