"""The whole run's configuration: shared sections plus every service's own section.

`tidal rl` validates this strictly before anything starts (an unknown key anywhere fails
with its path and a suggestion), then writes the resolved file that every child reads.
Service config modules are pydantic-only (no torch), so importing this stays fast.
"""

from __future__ import annotations

from tidal.common.sections import SharedConfig
from tidal.inference.config import InferenceConfig
from tidal.orchestrator.config import OrchestratorConfig
from tidal.trainer.config import TrainerConfig
from tidal.weightsync.config import WeightSyncConfig


class RunConfig(SharedConfig):
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    inference: InferenceConfig = InferenceConfig()
    trainer: TrainerConfig = TrainerConfig()
    weightsync: WeightSyncConfig = WeightSyncConfig()
