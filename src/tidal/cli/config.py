"""The whole run's configuration: shared sections plus every service's own section.

`tidal rl` validates this strictly before anything starts (an unknown key in a section it
reads fails with its path and a suggestion; `[sft]` and `[export]` pass through), then
writes the resolved file that every child reads. Service config modules are pydantic-only
(no torch), so importing this stays fast. `[deployment]`, `[slurm]` and `[supervision]`
are the launcher's own: they are applied (devices, trainer world size, restarts) and left
out of the file the services read.
"""

from __future__ import annotations

from pydantic import model_validator

from tidal.cli.placement import DeploymentConfig
from tidal.cli.slurm import SlurmConfig
from tidal.cli.supervision import SupervisionConfig
from tidal.common.config.shared import ServiceRunConfig
from tidal.inference.config import InferenceConfig
from tidal.orchestrator.config import OrchestratorConfig
from tidal.trainer.config import TrainerConfig
from tidal.trainer.model_folder import check_tokenizer_fits
from tidal.trainer.shared_prompts import TURN_OFF, shared_prompt_conflicts
from tidal.weightsync.config import BroadcastTransport, WeightSyncConfig


class RunConfig(ServiceRunConfig):
    orchestrator: OrchestratorConfig = OrchestratorConfig()  # type: ignore[assignment]
    inference: InferenceConfig = InferenceConfig()  # type: ignore[assignment]
    trainer: TrainerConfig = TrainerConfig()  # type: ignore[assignment]
    weightsync: WeightSyncConfig = WeightSyncConfig()  # type: ignore[assignment]
    deployment: DeploymentConfig = DeploymentConfig()  # type: ignore[assignment]
    """Which visible GPUs inference and the trainer get (local `tidal rl`)."""
    slurm: SlurmConfig | None = None  # type: ignore[assignment]
    """Set to write (and submit) a multi-node sbatch script instead of running locally."""
    supervision: SupervisionConfig = SupervisionConfig()  # type: ignore[assignment]
    """How `tidal rl` restarts a service that died (backoff, restart budget)."""

    @model_validator(mode="after")
    def _check_vocab(self) -> RunConfig:
        """The run's tokenizer must fit the model's embedding (both sections are needed)."""
        model = self.trainer.model
        check_tokenizer_fits(self.run.tokenizer, model.path, model.vocab_size)
        return self

    @model_validator(mode="after")
    def _shared_prompts_fit_the_trainer(self) -> RunConfig:
        """Shared prompts are on unless the trainer cannot train them: left unset, they
        follow the trainer; set to true against such a trainer, the config is refused at
        start rather than at the first step."""
        packing = self.orchestrator.packing
        if not packing.share_prompts:
            return self
        conflicts = shared_prompt_conflicts(self.trainer, cp=self.trainer.parallel.cp)
        if not conflicts:
            return self
        if "share_prompts" not in packing.model_fields_set:
            packing.share_prompts = False
            return self
        raise ValueError(
            "orchestrator.packing.share_prompts = true does not train with "
            f"{'; '.join(conflicts)}; or set {TURN_OFF}"
        )

    @model_validator(mode="after")
    def _broadcast_group_follows_replicas(self) -> RunConfig:
        """A broadcast group holds every inference replica unless told otherwise; one
        larger than `inference.replicas` would wait for replicas that never come."""
        transport = self.weightsync.transport
        if not isinstance(transport, BroadcastTransport):
            return self
        if "replicas" not in transport.model_fields_set:
            transport.replicas = self.inference.replicas
        elif transport.replicas > self.inference.replicas:
            raise ValueError(
                f"weightsync.transport.replicas = {transport.replicas} but inference.replicas "
                f"= {self.inference.replicas}: the first broadcast group would wait for "
                "replicas that never start; leave weightsync.transport.replicas unset (it "
                "follows inference.replicas) or lower it"
            )
        return self


LAUNCHER_SECTIONS = {"deployment", "slurm", "supervision"}
