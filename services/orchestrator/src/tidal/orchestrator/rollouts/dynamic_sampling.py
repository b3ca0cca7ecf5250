"""Fill a step's batch with groups, in rounds: DAPO dynamic sampling when `keep` is given.

Generic over the group type and free of I/O (`draw`, `generate` and `keep` are plugged
in), so tests use plain functions. Each round draws exactly the groups still missing, so
every drawn prompt is kept or counted as dropped; without `keep` there is one round. When
`max_rounds` rounds leave the batch empty, the last round is kept (zero advantages) so the
step sequence goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tidal.orchestrator.tasks.base import Problem

G = TypeVar("G")


@dataclass
class FilledBatch(Generic[G]):
    kept: list[G]
    drawn: list[Problem]
    generated: list[G] = field(default_factory=list)
    """Every group generated, kept or not (for failure counts)."""
    rounds: int = 0
    dropped: int = 0
    """Groups dropped for lack of signal."""


async def fill_batch(
    wanted: int,
    *,
    draw: Callable[[int], list[Problem]],
    generate: Callable[[int, list[Problem]], Awaitable[list[G]]],
    keep: Callable[[G], bool] | None,
    max_rounds: int,
) -> FilledBatch[G]:
    """Up to `wanted` groups, drawing and generating in at most `max_rounds` rounds."""
    batch: FilledBatch[G] = FilledBatch(kept=[], drawn=[])
    last: list[G] = []
    while len(batch.kept) < wanted and batch.rounds < max_rounds:
        problems = draw(wanted - len(batch.kept))
        batch.drawn += problems
        last = await generate(batch.rounds, problems)
        batch.generated += last
        batch.rounds += 1
        if keep is None:
            batch.kept = list(last)
            break
        signal = [g for g in last if keep(g)]
        batch.dropped += len(last) - len(signal)
        batch.kept += signal
    if not batch.kept:
        batch.kept = list(last)
    return batch
