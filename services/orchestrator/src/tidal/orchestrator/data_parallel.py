"""The trainer's data-parallel degree, as the orchestrator packs for it.

Decisions:
- The degree belongs to the trainer (`trainer.world_size` and `trainer.parallel.*`:
  dp_replicate × dp_shard, context-parallel ranks sharing a batch), so the orchestrator
  reads it from the trainer's GetStatus (`data_parallel_ranks`) once at start-up, after
  the trainer is healthy, instead of asking the user to restate it.
  `orchestrator.packing.data_parallel_ranks` stays as an optional assertion: unset, the
  trainer's degree is used; set and different, the orchestrator fails before the first
  step with an error naming both settings and the fix. Later a mismatch would surface
  only halfway: a rank the trainer lacks is refused at the first Train, too few ranks
  leave the trainer's other ranks idle, silently.
- A trainer that reports 0 predates the field; then the configured value (else 1) is used.
"""

from __future__ import annotations

import logging

from tidal.common.errors import ConfigError

log = logging.getLogger(__name__)
KEY = "orchestrator.packing.data_parallel_ranks"


def resolve_data_parallel_ranks(configured: int | None, reported: int, *, trainer: str) -> int:
    """The degree to pack for, given the configured value and the trainer's report."""
    if reported <= 0:
        log.warning("the trainer at %s reports no data-parallel degree; using %s", trainer, KEY)
        return configured or 1
    if configured is not None and configured != reported:
        raise ConfigError(
            f"{KEY} = {configured} but the trainer at {trainer} trains with {reported} "
            f"data-parallel rank(s) (trainer.world_size / trainer.parallel.cp, i.e. "
            f"trainer.parallel.dp_replicate × dp_shard); unset {KEY} to use the trainer's "
            f"degree, or set it to {reported}"
        )
    return reported
