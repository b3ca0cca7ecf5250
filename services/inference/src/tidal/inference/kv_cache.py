"""The paged KV cache: its size, its blocks' storage, and the attention that reads them.

Position p of a sequence lives in block `table[p // block_size]` at offset `p %
block_size`. Values are one tensor `(L, num_blocks * block_size, Hkv, D)`, the position's
row being `block * block_size + offset`; keys are `(L, num_blocks, Hkv, D, block_size)`,
the position last inside a block, so decode scores a block's keys as vector FMAs over D
(decode_attention.py's kernels read both layouts). Which blocks a sequence holds is
`block_manager.BlockManager`'s business. Prefill gathers a sequence's cached prefix and
attends with torch's SDPA; decode calls the kernel decode_attention.py chose. The cache is
sized once, at the first load, from `kv_cache_mb` (or a fraction of free memory) and
`max_model_len`, and refuses a budget that holds not one full sequence.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
from typing import Any

import torch

from tidal.inference.block_manager import BlockManager, blocks_for
from tidal.inference.decode_attention import BlockReads, DecodeKernel, sdpa_decode
from tidal.models.args import DecoderArgs
from tidal.models.attention import sdpa

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 4096
"""Served length when `inference.max_model_len` is unset and the model's context is longer."""


def served_length(context: int, max_model_len: int | None) -> int:
    """Longest prompt plus completion served: `max_model_len`, or the model's `context`
    capped at `DEFAULT_MAX_MODEL_LEN`; ValueError when `max_model_len` exceeds `context`."""
    if max_model_len is None:
        if context > DEFAULT_MAX_MODEL_LEN:
            log.info(
                "serving sequences of up to %d tokens of the model's %d (inference.max_model_len "
                "unset); set inference.max_model_len for longer ones",
                DEFAULT_MAX_MODEL_LEN,
                context,
            )
        return min(context, DEFAULT_MAX_MODEL_LEN)
    if max_model_len > context:
        raise ValueError(
            f"inference.max_model_len = {max_model_len} is above the model's context "
            f"({context} positions, max_position_embeddings); lower it to at most {context}"
        )
    return max_model_len


def token_bytes(args: DecoderArgs, dtype: torch.dtype) -> int:
    """Bytes of keys plus values one cached token takes across all layers."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * args.n_layers * args.n_kv_heads * args.head_dim * itemsize


def block_bytes(args: DecoderArgs, dtype: torch.dtype, block_size: int) -> int:
    """Bytes of keys plus values one block holds across all layers."""
    return token_bytes(args, dtype) * block_size


def free_memory_bytes(device: torch.device) -> int:
    """Memory free on `device` now: CUDA's free bytes, or the host's available pages."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def kv_budget_bytes(device: torch.device, *, memory_mb: float, fraction: float | None) -> int:
    """The KV cache's memory: `fraction` of `device`'s free memory when set, else `memory_mb`."""
    if fraction is None:
        return int(memory_mb * 2**20)
    return int(fraction * free_memory_bytes(device))


def blocks_within(
    args: DecoderArgs, dtype: torch.dtype, *, block_size: int, memory_bytes: int, max_model_len: int
) -> int:
    """Blocks that fit in `memory_bytes`; ValueError naming the keys when not one
    `max_model_len` sequence fits."""
    per_block = block_bytes(args, dtype, block_size)
    fit = memory_bytes // per_block
    need = blocks_for(max_model_len, block_size)
    if fit < need:
        raise ValueError(
            f"the KV cache's memory ({memory_bytes / 2**20:.2f} MiB, inference.kv_cache_mb or "
            f"kv_cache_memory_fraction) holds {fit} blocks of {block_size} tokens "
            f"({per_block / 2**20:.4f} MiB each); one sequence of max_model_len = "
            f"{max_model_len} needs {need}: raise inference.kv_cache_mb (or "
            "kv_cache_memory_fraction) or lower inference.max_model_len"
        )
    return int(fit)


def lazy_zeros(shape: tuple[int, ...], *, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """A tensor of zeros; on CPU backed by an anonymous mapping, whose pages the kernel
    zero-fills at first touch, so a large cache costs memory as it fills, not at load."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    memory = mmap.mmap(-1, nbytes)  # the tensor keeps the mapping alive (torch.frombuffer)
    return torch.frombuffer(memory, dtype=torch.uint8).view(dtype).view(shape)


def rows_of(tables: list[list[int]], length: int, block_size: int, device: Any) -> torch.Tensor:
    """Cache rows `(B, length)` of positions `[0, length)` of each table; positions past a
    table's blocks read row 0 (the caller masks them)."""
    width = blocks_for(length, block_size)
    padded = torch.tensor(
        [t[:width] + [0] * (width - len(t[:width])) for t in tables], device=device
    )
    pos = torch.arange(length, device=device)  # (S,)
    return padded[:, pos // block_size] * block_size + pos % block_size  # (B, S)


class PagedKVCache:
    """Keys and values of `num_blocks` blocks, and the manager deciding who holds them."""

    def __init__(
        self,
        args: DecoderArgs,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: Any,
        prefix_caching: bool = True,
        decode_kernel: DecodeKernel = sdpa_decode,
    ) -> None:
        n_kv, d = args.n_kv_heads, args.head_dim
        key_shape = (args.n_layers, num_blocks, n_kv, d, block_size)
        self.k = lazy_zeros(key_shape, dtype=dtype, device=device)  # (L, NB, Hkv, D, BS)
        self.v = lazy_zeros(
            (args.n_layers, num_blocks * block_size, n_kv, d), dtype=dtype, device=device
        )  # (L, NB * BS, Hkv, D)
        self.block_size = block_size
        self.decode_kernel = decode_kernel
        """Attention of one decode step over the cached keys (decode_attention.py)."""
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching)
        # Per-layer views made once: a step's layers index them, not the whole cache.
        self.layers = list(zip(self.k.unbind(0), self.v.unbind(0), strict=True))
        """(keys (NB, Hkv, D, BS), values (NB * BS, Hkv, D)) of each layer, contiguous."""

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values of the whole cache."""
        return self.k.nbytes + self.v.nbytes

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy every position of each `(source, target)` block pair (samples' own tails),
        all layers and pairs in one indexed copy per cache."""
        if not pairs:
            return
        device = self.k.device
        sources = torch.tensor([s for s, _ in pairs], device=device)
        targets = torch.tensor([t for _, t in pairs], device=device)
        n_layers, n_blocks = self.k.shape[0], self.blocks.num_blocks
        for cache in (self.k, self.v):
            by_block = cache.view(n_layers, n_blocks, -1)  # (L, NB, block's keys or values)
            by_block.index_copy_(1, targets, by_block.index_select(1, sources))

    def extend(
        self, tables: list[list[int]], starts: list[int], lengths: list[int]
    ) -> ExtendAttention:
        return ExtendAttention(self, tables, starts, lengths)

    def decode(self, tables: list[list[int]], positions: list[int]) -> DecodeAttention:
        return DecodeAttention(self, tables, positions)

    def slots(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, offset) of each cache row in `rows` (N,): where its key sits."""
        return rows // self.block_size, rows % self.block_size

    def write_keys(
        self, layer: int, slots: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor
    ) -> None:
        """Keys `k` (N, Hkv, D) at `slots` (blocks and offsets, (N,) each) of `layer`."""
        keys = self.layers[layer][0]  # (NB, Hkv, D, BS)
        keys.permute(0, 3, 1, 2).index_put_(slots, k)  # (NB, BS, Hkv, D) view

    def read_keys(self, layer: int, slots: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Keys (N, Hkv, D) at `slots` (blocks and offsets, (N,) each) of `layer`."""
        return self.layers[layer][0].permute(0, 3, 1, 2)[slots]


class ExtendAttention:
    """Sequences' new tokens packed into one `(1, T)` row, each on top of its cached prefix.

    Sequence i computes positions `[starts[i], starts[i] + lengths[i])`, occupying row
    positions `[offsets[i], offsets[i] + lengths[i])` of the packed input. Each attends
    only to its own keys, so packing computes what separate forwards would, unpadded.
    """

    def __init__(
        self, cache: PagedKVCache, tables: list[list[int]], starts: list[int], lengths: list[int]
    ) -> None:
        self.cache, self.starts, self.lengths = cache, starts, lengths
        self.offsets = [sum(lengths[:i]) for i in range(len(lengths))]
        device, bs = cache.k.device, cache.block_size
        # Rows of every sequence's positions [0, end): the new ones are written, all are read.
        self.rows = [
            rows_of([t], s + n, bs, device)[0]
            for t, s, n in zip(tables, starts, lengths, strict=True)
        ]
        self.slots = [cache.slots(rows) for rows in self.rows]  # rows as (blocks, offsets)
        self.masks: list[torch.Tensor | None] = []
        for s, n in zip(starts, lengths, strict=True):
            if s == 0:  # nothing cached before: plain causal attention over the new keys
                self.masks.append(None)
                continue
            query_pos = torch.arange(s, s + n, device=device)  # (n,)
            key_pos = torch.arange(s + n, device=device)  # (S,)
            self.masks.append(key_pos[None, :] <= query_pos[:, None])  # (n, S) True = attend

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        cache = self.cache
        cv = cache.layers[layer][1]  # (NB * BS, Hkv, D)
        outs = []
        for rows, (blocks, offsets), start, off, n, mask in zip(
            self.rows, self.slots, self.starts, self.offsets, self.lengths, self.masks, strict=True
        ):
            ks, vs = k[0, :, off : off + n], v[0, :, off : off + n]  # (Hkv, n, D)
            new = (blocks[start:], offsets[start:])  # the slots of the new positions
            cache.write_keys(layer, new, ks.transpose(0, 1))
            cv.index_copy_(0, rows[start:], vs.transpose(0, 1))
            qs = q[:, :, off : off + n]  # (1, H, n, D)
            if mask is None:
                outs.append(sdpa(qs, ks[None], vs[None], mask=None, causal=True))
            else:
                keys = cache.read_keys(layer, (blocks, offsets)).transpose(0, 1)[None]
                values = cv[rows].transpose(0, 1)[None]
                outs.append(sdpa(qs, keys, values, mask=mask[None, None], causal=False))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (1, H, T, D)


class DecodeAttention:
    """One new token per sequence at its own position, its keys read through its block table.

    Each layer writes the step's keys and values at their positions, then the cache's
    decode kernel attends over `reads`: every sequence's positions up to its own. Block
    tables are padded to the longest (with block 0, which no kernel reads for a sequence
    shorter than the padding: SDPA masks it, the native kernel stops at the position).
    """

    def __init__(self, cache: PagedKVCache, tables: list[list[int]], positions: list[int]) -> None:
        self.cache = cache
        device, bs = cache.k.device, cache.block_size
        width = max(positions) // bs + 1  # blocks read per sequence
        self.reads = BlockReads(
            table=torch.tensor(
                [t[:width] + [0] * (width - len(t[:width])) for t in tables], device=device
            ),  # (B, W)
            positions=torch.tensor(positions, device=device),  # (B,)
            block_size=bs,
            span=max(positions) + 1,
            in_step=min(positions) == max(positions),
        )
        self.write_rows = torch.tensor(
            [t[p // bs] * bs + p % bs for t, p in zip(tables, positions, strict=True)],
            device=device,
        )  # (B,)
        self.write_slots = cache.slots(self.write_rows)  # the same as (block, offset)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        keys, values = self.cache.layers[layer]  # (NB, Hkv, D, BS), (NB * BS, Hkv, D)
        self.cache.write_keys(layer, self.write_slots, k[:, :, 0])  # k: (B, Hkv, 1, D)
        values.index_copy_(0, self.write_rows, v[:, :, 0])
        return self.cache.decode_kernel(q, keys, values, self.reads)  # (B, H, 1, D)
