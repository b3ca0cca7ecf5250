"""Blocks of the paged KV cache: who holds which, and which full blocks can be reused.

Blocks are reference counted: the n samples of a request share their prompt's full
blocks instead of copying them. A full, computed block is registered in the prefix cache
under a hash chained from its predecessor's, and its tokens are compared on every hit, so
equal tokens at another prefix never collide and a hash collision is a miss, never wrong
keys. A released block stays findable until its memory is needed (free blocks are taken
first, then cached ones least recently released), so a later turn of an episode finds the
earlier turn's blocks. New weights clear the prefix cache: old keys must not serve them.
"""

from __future__ import annotations

from collections import OrderedDict


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` positions."""
    return -(-tokens // block_size)


class BlockManager:
    """Allocation, reference counts and the content-hash prefix cache of `num_blocks` blocks."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        """False: no block is registered nor looked up (every prompt is computed)."""
        self._free = list(range(num_blocks - 1, -1, -1))  # never used or forgotten: a stack
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block -> its content hash, for registered blocks
        self._tokens_of: dict[int, tuple[int, ...]] = {}
        self._by_hash: dict[int, int] = {}  # content hash -> block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, count 0, LRU first
        self.hits = 0
        """Blocks taken from the prefix cache instead of computed (since construction); the
        caller counts them once it keeps what `lookup` found."""

    # -- read-only views ----------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - len(self._free) - len(self._evictable)

    @property
    def available(self) -> int:
        """Blocks an allocation can take now: free ones plus cached ones nobody holds."""
        return len(self._free) + len(self._evictable)

    @property
    def cached(self) -> int:
        """Blocks registered in the prefix cache (held or not)."""
        return len(self._by_hash)

    # -- allocation ---------------------------------------------------------------------------

    def allocate(self) -> int:
        """A block with count 1; evicts the least recently released cached block if needed."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._forget(block)
        else:
            raise RuntimeError("no free KV-cache block (the scheduler admits only what fits)")
        self._refs[block] = 1
        return block

    def share(self, block: int) -> int:
        """One more holder of `block` (a group sample sharing its prompt)."""
        self._refs[block] += 1
        return block

    def release(self, table: list[int]) -> None:
        """Drop one reference to each block of `table`; cached blocks stay findable."""
        for block in reversed(table):  # the tail first: it is the least likely to be reused
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    # -- prefix cache -------------------------------------------------------------------------

    def chain_hashes(
        self, token_ids: list[int], full_blocks: int, known: list[int] | None = None
    ) -> list[int]:
        """Content hashes of (at least) the first `full_blocks` blocks of `token_ids`.

        `known` holds the hashes of its leading blocks computed before (a sequence's own
        list): it is extended in place and returned, so a growing sequence hashes each
        block once."""
        hashes = [] if known is None else known
        parent, bs = (hashes[-1] if hashes else 0), self.block_size
        for i in range(len(hashes), full_blocks):
            parent = hash((parent, tuple(token_ids[i * bs : (i + 1) * bs])))
            hashes.append(parent)
        return hashes

    def lookup(
        self, token_ids: list[int], max_blocks: int, known: list[int] | None = None
    ) -> list[int]:
        """Cached blocks holding the longest prefix of `token_ids` (at most `max_blocks`),
        each taken with one more reference; `known` as in `chain_hashes`."""
        found: list[int] = []
        bs = self.block_size
        if not self.prefix_caching:
            return found
        for i, h in enumerate(self.chain_hashes(token_ids, max_blocks, known)[:max_blocks]):
            block = self._by_hash.get(h)
            if block is None or self._tokens_of[block] != tuple(token_ids[i * bs : (i + 1) * bs]):
                break
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            found.append(block)
        return found

    def register(
        self,
        table: list[int],
        token_ids: list[int],
        start_block: int,
        end_block: int,
        known: list[int] | None = None,
    ) -> None:
        """Register blocks `[start_block, end_block)` of `table`, full and computed, whose
        tokens are `token_ids[: end_block * block_size]`'s; `known` as in `chain_hashes`."""
        if end_block <= start_block or not self.prefix_caching:
            return
        bs = self.block_size
        hashes = self.chain_hashes(token_ids, end_block, known)
        for i in range(start_block, end_block):
            block, h = table[i], hashes[i]
            if block in self._hash_of or h in self._by_hash:
                continue  # already registered, or an equal block is: keep the first
            self._hash_of[block] = h
            self._tokens_of[block] = tuple(token_ids[i * bs : (i + 1) * bs])
            self._by_hash[h] = block

    def clear_prefix_cache(self) -> None:
        """Forget every registered block (new weights make their keys stale)."""
        for block in list(self._hash_of):
            self._forget(block)
        while self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._free.append(block)

    def _forget(self, block: int) -> None:
        h = self._hash_of.pop(block)
        del self._tokens_of[block]
        del self._by_hash[h]
