"""The block manager's prefix cache keeps released blocks findable, evicting the least
recently released first."""

from __future__ import annotations

from tidal.inference.block_manager import BlockManager


def test_block_manager_evicts_least_recently_released_cached_blocks() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    first, second = [0, 1, 2, 3], [4, 5, 6, 7]
    a = [manager.allocate(), manager.allocate()]
    manager.register(a, first, 0, 2)
    b = [manager.allocate(), manager.allocate()]
    manager.register(b, second, 0, 2)
    manager.release(a)
    manager.release(b)
    assert (manager.used, manager.available, manager.cached) == (0, 4, 4)
    manager.allocate()  # takes one of `first`'s blocks, released earliest
    assert manager.lookup(second, 2) == b
    assert len(manager.lookup(first, 2)) < 2
