"""The paged KV cache: fixed-size blocks addressed through per-sequence block tables.

Decisions:
- Storage is one tensor each for keys and values, `(L, num_blocks * block_size, Hkv, D)`:
  a token position's *row* is `block * block_size + offset`. Writes are one
  `index_copy_` per layer over the rows of the new tokens; which blocks a sequence holds
  is `block_manager.BlockManager`'s business, not this module's.
- Reads gather: before attention, a sequence's rows `[0, S)` are gathered into a
  contiguous `(B, Hkv, S, D)` view and handed to SDPA, exactly the tensors the slot cache
  hands it. This is the simple CPU implementation: one extra copy of the keys read per
  layer and step, in exchange for reusing the SDPA kernels and giving the slot cache's
  numbers on decode. Measured end to end (16 sequences, 64 new tokens, fp32, one
  thread, docs/benchmarks/inference.md): 0.93-0.98x the slot cache's tokens/s at
  32-64-token prompts, ~0.82x at 384-token prompts, the gather growing with context.
  A GPU kernel (vLLM's paged attention, FlashInfer, flash-attn's `block_table` argument)
  reads keys straight from the blocks inside the attention kernel and never
  materialises the gathered copy.
- Prefill is an *extend*: each sequence computes positions `[start, end)` on top of
  `start` positions already cached (a prefix-cache hit, an earlier chunk of a chunked
  prefill, or nothing). With `start == 0` it is plain causal SDPA over the new keys (as
  the slot cache does); otherwise the new queries attend to the gathered cached rows
  plus the new ones under an offset causal mask.
- Decode reuses the slot cache's `grouped_decode_attention` and its additive mask, so
  a paged decode step computes the same sums as a slot decode step.
"""

from __future__ import annotations

from typing import Any

import torch

from tidal.inference.block_manager import BlockManager
from tidal.inference.kv_cache import grouped_decode_attention, token_bytes
from tidal.inference.lazy_zeros import lazy_zeros
from tidal.models.args import DecoderArgs
from tidal.models.attention import sdpa


def block_bytes(args: DecoderArgs, dtype: torch.dtype, block_size: int) -> int:
    """Bytes of keys plus values one block holds across all layers."""
    return token_bytes(args, dtype) * block_size


def blocks_within(
    args: DecoderArgs, dtype: torch.dtype, *, block_size: int, memory_bytes: int, max_model_len: int
) -> int:
    """Blocks that fit in `memory_bytes`; ValueError when not one full-length sequence fits."""
    per_block = block_bytes(args, dtype, block_size)
    fit = memory_bytes // per_block
    need = -(-max_model_len // block_size)
    if fit < need:
        raise ValueError(
            f"the paged KV cache's memory ({memory_bytes / 2**20:.2f} MiB) holds {fit} blocks of "
            f"{block_size} tokens ({per_block / 2**20:.4f} MiB each); one sequence of "
            f"max_model_len = {max_model_len} needs {need}: raise inference.kv_cache_mb "
            "(or kv_cache_memory_fraction) or lower inference.max_model_len"
        )
    return int(fit)


def rows_of(tables: list[list[int]], length: int, block_size: int, device: Any) -> torch.Tensor:
    """Cache rows `(B, length)` of positions `[0, length)` of each table; positions past a
    table's blocks read row 0 (the caller masks them)."""
    width = -(-length // block_size)
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
    ) -> None:
        shape = (args.n_layers, num_blocks * block_size, args.n_kv_heads, args.head_dim)
        self.k = lazy_zeros(shape, dtype=dtype, device=device)  # (L, NB * BS, Hkv, D)
        self.v = lazy_zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.blocks = BlockManager(num_blocks, block_size)

    def copy_block(self, source: int, target: int) -> None:
        """Copy every position of block `source` into block `target` (a sample's own tail)."""
        bs = self.block_size
        for cache in (self.k, self.v):
            cache[:, target * bs : (target + 1) * bs] = cache[:, source * bs : (source + 1) * bs]

    def extend(
        self, tables: list[list[int]], starts: list[int], lengths: list[int]
    ) -> ExtendAttention:
        return ExtendAttention(self, tables, starts, lengths)

    def decode(self, tables: list[list[int]], positions: torch.Tensor) -> PagedDecodeAttention:
        return PagedDecodeAttention(self, tables, positions)


class ExtendAttention:
    """Sequences' new tokens packed into one `(1, T)` row, each on top of its cached prefix.

    Sequence i computes positions `[starts[i], starts[i] + lengths[i])`, occupying row
    positions `[offsets[i], offsets[i] + lengths[i])` of the packed input.
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
        self.masks: list[torch.Tensor | None] = []
        for s, n in zip(starts, lengths, strict=True):
            if s == 0:
                self.masks.append(None)
                continue
            query_pos = torch.arange(s, s + n, device=device)  # (n,)
            key_pos = torch.arange(s + n, device=device)  # (S,)
            self.masks.append(key_pos[None, :] <= query_pos[:, None])  # (n, S) True = attend

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        ck, cv = self.cache.k[layer], self.cache.v[layer]  # (NB * BS, Hkv, D)
        outs = []
        for rows, start, off, n, mask in zip(
            self.rows, self.starts, self.offsets, self.lengths, self.masks, strict=True
        ):
            ks, vs = k[0, :, off : off + n], v[0, :, off : off + n]  # (Hkv, n, D)
            ck.index_copy_(0, rows[start:], ks.transpose(0, 1))  # rows of the new positions
            cv.index_copy_(0, rows[start:], vs.transpose(0, 1))
            qs = q[:, :, off : off + n]  # (1, H, n, D)
            if mask is None:
                outs.append(sdpa(qs, ks[None], vs[None], mask=None, causal=True))
            else:
                keys = ck[rows].transpose(0, 1)[None]  # (1, Hkv, S, D), gathered
                values = cv[rows].transpose(0, 1)[None]
                outs.append(sdpa(qs, keys, values, mask=mask[None, None], causal=False))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (1, H, T, D)


class PagedDecodeAttention:
    """One new token per sequence at its own position, its keys read through its block table.

    Reads gather whole blocks: the cache viewed as `(blocks, block_size * Hkv * D)` rows,
    one `index_select` of each sequence's `W` blocks, viewed as `(B, W * block_size, Hkv,
    D)`; positions past a sequence's own are masked. Gathering per block instead of per
    position (the first version) means a `(B, W)` index built per step instead of a
    `(B, S)` one, and copies of contiguous block-sized chunks.
    """

    def __init__(
        self, cache: PagedKVCache, tables: list[list[int]], positions: torch.Tensor
    ) -> None:
        self.cache = cache
        device, bs = positions.device, cache.block_size
        pos = positions.tolist()
        width = max(pos) // bs + 1  # blocks read per sequence
        self.batch, self.width = len(tables), width
        self.blocks = torch.tensor(
            [t[:width] + [0] * (width - len(t[:width])) for t in tables], device=device
        ).flatten()  # (B * W,); padding reads block 0, masked below
        self.write_rows = torch.tensor(
            [t[p // bs] * bs + p % bs for t, p in zip(tables, pos, strict=True)], device=device
        )  # (B,)
        keys = torch.arange(width * bs, device=device)
        visible = keys[None, :] <= positions[:, None]  # (B, W * BS)
        mask = torch.zeros(visible.shape, dtype=cache.k.dtype, device=device)
        mask.masked_fill_(~visible, float("-inf"))
        self.mask = mask[:, None, None, :]  # (B, 1, 1, W * BS) additive, as the slot cache's

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        ck, cv = self.cache.k[layer], self.cache.v[layer]  # (NB * BS, Hkv, D)
        ck.index_copy_(0, self.write_rows, k[:, :, 0])  # k: (B, Hkv, 1, D)
        cv.index_copy_(0, self.write_rows, v[:, :, 0])
        _, n_kv, d = ck.shape
        span = self.width * self.cache.block_size
        by_block = (self.cache.blocks.num_blocks, -1)
        keys = ck.view(by_block).index_select(0, self.blocks)  # (B * W, BS * Hkv * D)
        values = cv.view(by_block).index_select(0, self.blocks)
        keys = keys.view(self.batch, span, n_kv, d).transpose(1, 2)  # (B, Hkv, W * BS, D)
        values = values.view(self.batch, span, n_kv, d).transpose(1, 2)
        return grouped_decode_attention(q, keys, values, self.mask)  # (B, H, 1, D)
