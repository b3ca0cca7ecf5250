"""What the `Trainer` asks of the ranks it trains with: one interface, one or many ranks.

The `Trainer` always has a `RankContext`, so train_step.py has one code path. The context
owns every place where ranks differ: wrapping the model, summing the step's counts and
metrics, the loss factor that turns a gradient average into the sum, the gradient work
after the last backward, clipping, and context-parallel logprobs. `SingleProcess` is
world size 1 (no process group); `torchrun_ranks.py`'s `TorchrunRanks` is many ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from tidal.batch.tensors import MicroBatchData
from tidal.trainer.loss_normalization import Reduce

Autocast = Callable[[], contextlib.AbstractContextManager[object]]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


class RankContext(Protocol):
    @property
    def cp(self) -> int:
        """Context-parallel degree: how many ranks share each sample's tokens (1: none)."""
        ...

    @property
    def shards_model(self) -> bool:
        """Whether `parallelize` shards the model (FSDP); levers such as FSDP CPU offload
        need it."""
        ...

    @property
    def runs_empty_micro_batches(self) -> bool:
        """Whether micro-batches without loss tokens still run (to keep collectives in step)."""
        ...

    @property
    def loss_scale(self) -> float:
        """Factor on each micro-batch's loss so the reduced gradient is the global sum."""
        ...

    def parallelize(self, model: nn.Module) -> nn.Module:
        """The model wrapped for these ranks (after the memory levers were applied)."""
        ...

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The step's token counts summed over the data-parallel ranks."""
        ...

    def sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        """The step's metric sums summed over every rank."""
        ...

    def finish_gradients(self, model: nn.Module) -> None:
        """After the step's last backward: make every gradient the global sum."""
        ...

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip every gradient to a global L2 norm of `max_norm`; returns the norm before."""
        ...

    def cp_logprobs(
        self, model: nn.Module, batch: MicroBatchData, autocast: Autocast
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """With cp > 1: this rank's (n, V) log-softmax, (n,) target logprobs, (n,) target
        index into the row and (n,) validity."""
        ...


@dataclass(frozen=True)
class SingleProcess:
    """World size 1: nothing to wrap, reduce or sum; no process group needed."""

    reduce: Reduce = _identity
    cp: int = 1
    shards_model: bool = False
    runs_empty_micro_batches: bool = False
    loss_scale: float = 1.0

    def parallelize(self, model: nn.Module) -> nn.Module:
        return model

    def sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def finish_gradients(self, model: nn.Module) -> None:
        return None

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def cp_logprobs(
        self, model: nn.Module, batch: MicroBatchData, autocast: Autocast
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        raise RuntimeError("context parallelism needs torchrun ranks (cp is 1 here)")
