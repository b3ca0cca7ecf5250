"""ParallelDims: the factors must multiply to the world size, and errors show the arithmetic."""

from __future__ import annotations

import pytest

from tidal.common.errors import ConfigError
from tidal.trainer.parallel.dims import ParallelDims


def test_dp_shard_takes_the_rest() -> None:
    dims = ParallelDims.build(world_size=8, dp_replicate=2, cp=2)
    assert (dims.dp_replicate, dims.dp_shard, dims.cp, dims.dp) == (2, 2, 2, 4)
    assert dims.fsdp_enabled


def test_single_process_needs_no_sharding() -> None:
    dims = ParallelDims.build(world_size=1)
    assert dims.dp == 1 and not dims.fsdp_enabled


def test_product_mismatch_shows_the_arithmetic() -> None:
    with pytest.raises(ConfigError, match=r"2 × 3 × 1 = 6, but trainer.world_size is 8"):
        ParallelDims.build(world_size=8, dp_replicate=2, dp_shard=3)


def test_world_size_that_does_not_factor_names_the_fields() -> None:
    with pytest.raises(ConfigError, match=r"world_size 6 is not divisible by dp_replicate × cp"):
        ParallelDims.build(world_size=6, dp_replicate=2, cp=2)


def test_ep_must_divide_dp_shard_and_the_experts() -> None:
    with pytest.raises(ConfigError, match=r"ep 3 must divide dp_shard 4"):
        ParallelDims.build(world_size=4, ep=3)
    dims = ParallelDims.build(world_size=4, ep=2)
    assert (dims.dp_shard, dims.dp_shard_mod_ep, dims.ep) == (4, 2, 2)
    dims.check_experts(8)
    with pytest.raises(ConfigError, match=r"ep 2 must divide the model's 5 experts"):
        dims.check_experts(5)


@pytest.mark.parametrize("field", ["dp_replicate", "cp", "ep"])
def test_non_positive_factor_names_the_field(field: str) -> None:
    with pytest.raises(ConfigError, match=rf"trainer.parallel.{field} must be >= 1"):
        ParallelDims.build(world_size=2, **{field: 0})
