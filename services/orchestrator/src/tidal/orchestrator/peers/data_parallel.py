"""The trainer's data-parallel degree, as the orchestrator packs for it.

The degree is the trainer's, read from its GetStatus once at start-up.
`orchestrator.packing.data_parallel_ranks` only restates it: a mismatch fails before the
first step naming both settings, rather than halfway (a rank the trainer lacks refused at
the first Train, or too few ranks leaving the trainer's others idle, silently). A trainer
that reports 0 gets the configured value (else 1).
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
