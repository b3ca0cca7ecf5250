"""Zigzag CP sharding: every token exactly once, and equal causal work per rank."""

from __future__ import annotations

import pytest
import torch

from tidal.batch.tensors import segment_ids
from tidal.trainer.parallel.cp import block_mask, shard_indices


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_shards_cover_every_token_once_with_equal_causal_work(cp: int) -> None:
    total = 48
    shards = [shard_indices(total, cp, r) for r in range(cp)]
    assert sorted(torch.cat(shards).tolist()) == list(range(total))
    work = {int((s + 1).sum()) for s in shards}  # keys a query sees under a causal mask
    assert len(work) == 1


def test_length_not_divisible_by_two_cp_is_refused() -> None:
    with pytest.raises(ValueError, match="divisible by 2·cp = 4"):
        shard_indices(30, 2, 0)


def test_block_mask_is_the_packed_causal_mask() -> None:
    seg = segment_ids(torch.tensor([3, 2]))
    index = torch.arange(5)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 0, 0, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(block_mask(index, seg, index, seg), expected)
