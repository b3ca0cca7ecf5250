"""The distillation teacher `tidal rl` starts: one inference child serving the teacher folder.

`orchestrator.distill.model_path` is served as a judge's folder is: the run's `[inference]`
settings and GPUs, that folder as a fixed version 0 (`inference.model_path`, never following
weight-sync), on a free loopback gRPC address with the run's transport security (the
orchestrator calls its Score as it calls the policy's Generate). `assign_teacher_address`
writes that address into `orchestrator.distill.address` before the resolved config is
written, so the orchestrator reads where its teacher is.
"""

from __future__ import annotations

from tidal.cli.config import RunConfig
from tidal.cli.inference_replicas import Replica
from tidal.cli.ports import free_address
from tidal.common.errors import ConfigError

NAME = "teacher"


def assign_teacher_address(config: RunConfig) -> str | None:
    """Give the teacher folder a free loopback address (None: no teacher to serve)."""
    distill = config.orchestrator.distill
    if distill.model_path is None:
        return None
    folder = distill.model_path.resolve()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"orchestrator.distill.model_path {folder} is not a model folder (no config.json)"
        )
    distill.model_path = folder
    distill.address = distill.address or free_address()
    return distill.address


def teacher_replicas(config: RunConfig, env: dict[str, str]) -> list[Replica]:
    """The inference child serving the teacher (after `assign_teacher_address`)."""
    distill = config.orchestrator.distill
    if distill.model_path is None or distill.address is None:
        return []
    args = (
        *("--endpoints.inference", distill.address),
        *("--inference.replica_id", NAME),
        *("--inference.model_path", str(distill.model_path)),
        *("--inference.replicas", "1"),
        *("--inference.http.enabled", "false"),
    )
    return [Replica(NAME, args, dict(env))]
