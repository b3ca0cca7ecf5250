"""Balancing data-parallel ranks: the cost model, and a step's samples split over ranks.

Decisions:
- Cost of a sample of L tokens is `L + L² / QUADRATIC_SCALE`: the linear part is the
  MLP and projections, the quadratic part attention; QUADRATIC_SCALE is the length at
  which both are equal for a small model (an estimate; only the ordering matters much).
  This is the one cost model: the orchestrator balances samples with it and the
  trainer's rank 0 (`tidal.trainer.parallel.assign`) balances whole micro-batches with
  `batch_cost`, so both sides agree on what "balanced" means.
- Longest-processing-time first: samples in decreasing cost go to the rank with the least
  cost so far. The last sample placed on the most loaded rank went to the least loaded
  one at that time, so max − min rank cost ≤ one sample's cost.
- Ranks step in lock-step (one micro-batch each per accumulation step), so every rank
  needs the same number of micro-batches: ranks with fewer bins split their largest bin
  in two, ranks with more merge their two smallest bins while they fit the budget.
- The result is rank-major: with k micro-batches per rank, rank r trains
  micro_batches[r*k:(r+1)*k]. One rank gives exactly `pack_micro_batches`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tidal.batch.packing import PackedMicroBatch, TrainSample, assign_bins, build_micro_batch

QUADRATIC_SCALE = 2048.0


def sample_cost(num_tokens: int) -> float:
    """Estimated forward/backward cost of one sample of `num_tokens` tokens."""
    return num_tokens + num_tokens * num_tokens / QUADRATIC_SCALE


def batch_cost(sample_lengths: Iterable[int]) -> float:
    """Estimated cost of a packed micro-batch: the sum over its samples."""
    return sum(sample_cost(int(n)) for n in sample_lengths)


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
    """Micro-batches per rank: equal counts, cost within one sample, each ≤ budget."""
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
        [build_micro_batch([samples[i] for i in sorted(b)]) for b in bins] for bins in bins_per_rank
    ]
