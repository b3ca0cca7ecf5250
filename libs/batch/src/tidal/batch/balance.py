"""The one split of a step over data-parallel ranks: samples balanced by cost, then packed.

A sample of L tokens costs `L + L² / QUADRATIC_SCALE` (projections and MLP, attention).
Samples go longest first onto the cheapest rank, so rank costs differ by at most one
sample's cost. Ranks step in lock-step, so every rank gets the same number of
micro-batches (bins split or merged within the budget). Each micro-batch is labelled
with its rank, and the trainer trains it there as labelled; one rank is plain packing.
With prompt sharing the unit placed is a prompt's group (cut to fit the budget; the
largest halved while the ranks cannot get equal counts), so its prompt is held once.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidal.batch.packing import (
    PackedMicroBatch,
    TrainSample,
    assign_bins,
    build_micro_batch,
    prompt_groups,
)

QUADRATIC_SCALE = 2048.0  # a small model's length where attention costs what the rest does


def sample_cost(num_tokens: int) -> float:
    """Estimated forward/backward cost of one sample of `num_tokens` tokens."""
    return num_tokens + num_tokens * num_tokens / QUADRATIC_SCALE


def split_by_cost(costs: Sequence[float], ranks: int) -> list[list[int]]:
    """Indices of `costs` per rank, longest first onto the cheapest rank."""
    totals = [0.0] * ranks
    assigned: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(ranks), key=lambda r: (totals[r], len(assigned[r]), r))
        totals[rank] += costs[i]
        assigned[rank].append(i)
    return assigned


def _equalise(bins_per_rank: list[list[list[int]]], lengths: Sequence[int], budget: int) -> None:
    def size(b: list[int]) -> int:
        return sum(lengths[i] for i in b)

    while True:
        counts = [len(b) for b in bins_per_rank]
        low, high = min(counts), max(counts)
        if low == high:
            return
        rank_high = counts.index(high)
        rank_low = counts.index(low)
        splittable = [b for b in bins_per_rank[rank_low] if len(b) > 1]
        if splittable:
            largest = max(splittable, key=size)
            bins_per_rank[rank_low].remove(largest)
            bins_per_rank[rank_low] += [largest[0::2], largest[1::2]]
            continue
        smallest = sorted(bins_per_rank[rank_high], key=size)[:2]
        if size(smallest[0]) + size(smallest[1]) > budget:
            raise ValueError(
                f"cannot give {len(bins_per_rank)} data-parallel ranks equal micro-batch "
                f"counts (now {counts}) within {budget} tokens; raise micro_batch_tokens "
                "or the number of prompts per step"
            )
        for b in smallest:
            bins_per_rank[rank_high].remove(b)
        bins_per_rank[rank_high].append(smallest[0] + smallest[1])


def _unit_tokens(samples: Sequence[TrainSample], unit: list[int]) -> int:
    """Tokens of a unit: one sample, or a group's prompt once plus its completions."""
    if len(unit) == 1:
        return samples[unit[0]].num_tokens
    return len(samples[unit[0]].prompt_ids) + sum(len(samples[i].completion_ids) for i in unit)


def _unit_cost(samples: Sequence[TrainSample], unit: list[int]) -> float:
    """`sample_cost` of a unit: each completion attends to the prompt and to itself."""
    prompt = len(samples[unit[0]].prompt_ids)
    if len(unit) == 1:
        return sample_cost(samples[unit[0]].num_tokens)
    pairs = prompt * prompt
    for i in unit:
        n = len(samples[i].completion_ids)
        pairs += n * n + 2 * prompt * n
    return _unit_tokens(samples, unit) + pairs / QUADRATIC_SCALE


def _group_units(samples: Sequence[TrainSample], budget: int) -> list[list[int]]:
    """Each prompt's samples, cut into runs whose shared layout fits the budget."""
    units: list[list[int]] = []
    for group in prompt_groups(samples):
        # Without completion tokens a sample is laid out with its own prompt (packing.py).
        units += [[i] for i in group if not samples[i].completion_ids]
        run: list[int] = []
        for i in (i for i in group if samples[i].completion_ids):
            if run and _unit_tokens(samples, [*run, i]) > budget:
                units.append(run)
                run = []
            run.append(i)
        if run:
            units.append(run)
    return units


def _pack_units(
    samples: Sequence[TrainSample], units: list[list[int]], budget: int, ranks: int
) -> list[list[list[int]]]:
    """Sample indices of each rank's bins, the units balanced by cost and bin-packed."""
    lengths = [_unit_tokens(samples, u) for u in units]
    per_rank = split_by_cost([_unit_cost(samples, u) for u in units], ranks)
    bins_per_rank = [
        [[idx[j] for j in b] for b in assign_bins([lengths[i] for i in idx], budget)]
        for idx in per_rank
    ]
    _equalise(bins_per_rank, lengths, budget)
    return [[[i for u in sorted(b) for i in units[u]] for b in bins] for bins in bins_per_rank]


def _halves(unit: list[int]) -> list[list[int]]:
    half = (len(unit) + 1) // 2
    return [u for u in (unit[:half], unit[half:]) if u]


def pack_for_ranks(
    samples: Sequence[TrainSample], budget: int, ranks: int, *, share_prompts: bool = False
) -> list[list[PackedMicroBatch]]:
    """Micro-batches per rank, each labelled with its rank: equal counts, rank costs within
    one sample's (one group's with `share_prompts`), each ≤ budget."""
    if len(samples) < ranks:
        raise ValueError(f"{len(samples)} samples cannot feed {ranks} data-parallel ranks")
    units = _group_units(samples, budget) if share_prompts else [[i] for i in range(len(samples))]
    while True:
        try:
            if len(units) < ranks:  # every rank needs a unit
                raise ValueError(f"{len(units)} groups cannot feed {ranks} ranks")
            bins_per_rank = _pack_units(samples, units, budget, ranks)
            break
        except ValueError:
            splittable = [u for u in units if len(u) > 1]
            if not splittable:
                raise
            largest = max(splittable, key=lambda u: _unit_tokens(samples, u))
            units.remove(largest)
            units += _halves(largest)
    return [
        [
            build_micro_batch([samples[i] for i in b], rank=rank, share_prompts=share_prompts)
            for b in bins
        ]
        for rank, bins in enumerate(bins_per_rank)
    ]
