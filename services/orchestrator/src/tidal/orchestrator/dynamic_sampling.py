"""Fill a step's batch with groups, in rounds: DAPO dynamic sampling when `keep` is given.

Decisions:
- Generic over the group type and free of I/O: `draw(n)` supplies problems, `generate`
  turns a round's problems into groups, `keep` says whether a group carries a learning
  signal. The rollout generator plugs inference in; tests plug in plain functions.
- Each round draws exactly the number of groups still missing, so the batch never
  overshoots and every drawn prompt is accounted for (kept, or dropped and counted).
- Without `keep` there is one round and every group is kept (plain GRPO batches).
- When `max_rounds` rounds leave the batch empty, the last round is kept as it is (its
  advantages are zeros) so the step sequence continues; a partly filled batch trains
  with what it has. Both show in the step's metrics.
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
