"""What the service uses of a trainer: one interface for one process and for rank 0.

Decisions:
- `ServedTrainer` lists exactly what `service.py`, `runner.py`, `servicer.py` and the
  checkpoint manager use. The `Trainer` (train_step.py) satisfies it for a
  single-process trainer, `LeaderTrainer` (parallel/leader.py) for rank 0 of a torchrun
  job, which commands the other ranks before each collective and delegates the rest
  explicitly. Neither is a `__getattr__` proxy, so a method the service starts using
  must be added here and to both, and the type checker says so.
- It extends the checkpoint's `TrainingState` (model, optimizer, scheduler, step): the
  runner checkpoints whatever trainer it serves, with no unwrapping.
- `stop` ends the follower ranks after the server shut down; a single process has none.
- `LossKind` lives here, beside the interface that takes it, so the servicer and the
  leader name it without importing the training step.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch

from tidal.batch.tensors import MicroBatchData
from tidal.trainer.checkpoint import TrainingState
from tidal.trainer.config import TrainerConfig

LossKind = Literal["pg", "sft"]


class ServedTrainer(TrainingState, Protocol):
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
