"""The one split of a step over data-parallel ranks: samples balanced by cost, then packed.

A sample of L tokens costs `L + L² / QUADRATIC_SCALE` (projections and MLP, attention).
Samples go longest first onto the cheapest rank, so rank costs differ by at most one
sample's cost. Ranks step in lock-step, so every rank gets the same number of
micro-batches (bins split or merged within the budget). Each micro-batch is labelled
with its rank, and the trainer trains it there as labelled; one rank is plain packing.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidal.batch.packing import PackedMicroBatch, TrainSample, assign_bins, build_micro_batch

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


def pack_for_ranks(
    samples: Sequence[TrainSample], budget: int, ranks: int
) -> list[list[PackedMicroBatch]]:
    """Micro-batches per rank, each labelled with its rank: equal counts, rank costs within
    one sample's, each ≤ budget."""
    if len(samples) < ranks:
        raise ValueError(f"{len(samples)} samples cannot feed {ranks} data-parallel ranks")
    lengths = [s.num_tokens for s in samples]
    per_rank = split_by_cost([sample_cost(n) for n in lengths], ranks)
    bins_per_rank = [
        [[idx[j] for j in b] for b in assign_bins([lengths[i] for i in idx], budget)]
        for idx in per_rank
    ]
    _equalise(bins_per_rank, lengths, budget)
    return [
        [build_micro_batch([samples[i] for i in sorted(b)], rank=rank) for b in bins]
        for rank, bins in enumerate(bins_per_rank)
    ]
