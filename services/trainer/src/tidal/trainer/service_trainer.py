"""What the service uses of a trainer: one process's `Trainer`, or `TorchrunLeader`, rank 0
commanding the other torchrun ranks (leader.py); the runner serves either alike.

`ServiceTrainer` lists exactly what the service, runner, servicer and persistence call, and
both implement every member (no `__getattr__` proxy), so a new use is added here and to
both and the type checker says so. It extends the checkpoint's `TrainingState`, so the
served trainer is checkpointed without unwrapping. `LossKind` is the step journal's (it
records it); the servicer and the leader name it from here, without the training step.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tidal.batch.tensors import MicroBatchData
from tidal.trainer.config import TrainerConfig
from tidal.trainer.persistence.checkpoint import TrainingState
from tidal.trainer.persistence.journal import LossKind


class ServiceTrainer(TrainingState, Protocol):
    @property
    def config(self) -> TrainerConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def num_parameters(self) -> int: ...

    def describe(self) -> str:
        """One line naming the model, for logs and GetStatus."""
        ...

    def hf_config(self) -> dict[str, object]:
        """The Hugging Face `config.json` of the published weights."""
        ...

    def adapter_config(self) -> dict[str, object] | None:
        """PEFT-style description of published adapters (None unless publishing adapters)."""
        ...

    def train_step(
        self, step: int, batches: list[MicroBatchData], kind: LossKind
    ) -> dict[str, float]:
        """Train step `step` on the whole step's micro-batches; return its metrics."""
        ...

    def state_dict_for_publish(self) -> dict[str, torch.Tensor]:
        """The weights of the version to publish (full HF names, or LoRA adapters)."""
        ...

    def stop(self) -> None:
        """Release the follower ranks (no-op for one process)."""
        ...
