"""Where the loop starts: the trainer's next step, or with `resume` the saved progress
reconciled with the trainer.

Resuming restores the task cursors saved before the trainer's last trained step, drops
the metrics lines of steps lost with the trainer and writes the line of a step whose
Train reply was lost (records/resume.py), so a resumed run draws and logs what an
uninterrupted one would.
"""

from __future__ import annotations

import logging

from tidal.common.errors import ConfigError
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.peers.trainer_client import TrainerClient
from tidal.orchestrator.records.resume import (
    PROGRESS_FILE,
    drop_lost_lines,
    load_progress,
    recover_metrics_line,
    resume_point,
)
from tidal.orchestrator.records.run_log import RUN_LOG_FILE

log = logging.getLogger(__name__)


async def first_step_and_cursors(
    config: OrchestratorRunConfig, trainer: TrainerClient, mixture: TaskMixture
) -> int:
    """Where the loop starts, after restoring the task cursors when resuming."""
    trainer_step = await trainer.last_step()
    if not config.orchestrator.resume:
        if trainer_step:
            log.info(
                "trainer has trained %d steps; continuing at %d", trainer_step, trainer_step + 1
            )
        return trainer_step + 1
    saved = load_progress(config.run.dir / PROGRESS_FILE)
    if saved is None:
        if trainer_step:
            raise ConfigError(
                f"cannot resume: no {PROGRESS_FILE} in {config.run.dir} but the trainer is at "
                f"step {trainer_step}"
            )
        log.info("resume: no saved progress yet; starting at step 1")
        return 1
    first_step, state = resume_point(saved, trainer_step)
    mixture.load_state_dict(state)
    if lost := drop_lost_lines(config.run.dir / RUN_LOG_FILE, trainer_step):
        log.warning(
            "resume: step(s) %s were trained but lost with the trainer before they were "
            "durable; their metrics lines are removed and the steps trained again",
            ", ".join(map(str, lost)),
        )
    if recover_metrics_line(saved, trainer_step, config.run.dir / RUN_LOG_FILE):
        log.warning(
            "resume: step %d was trained but its reply was lost; its metrics line is written "
            "from what was saved before Train (marked recovered, no train/* values)",
            saved.step,
        )
    log.info("resume: trainer at step %d; continuing at step %d", trainer_step, first_step)
    return first_step
