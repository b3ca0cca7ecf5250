"""The KV cache: preallocated slots, one per running sequence, and its attention backends.

Decisions:
- Slots, not paged blocks: one tensor `[L, slots, H_kv, max_seq_len, D]` each for keys and
  values, allocated once under the configured memory bound and reused by every request.
  A sequence owns one slot from admission to its end. Slots waste the tail of short
  sequences but make every access a plain index (no block tables, no gather kernels), which
  is what makes the CPU path fast; the paged cache (`paged_kv.py`, `inference.kv_cache =
  "paged"`) is the alternative for long contexts and real model sizes.
- Prefill packs the new prompts into one `(1, T)` row, no padding, and runs causal
  attention per prompt, writing each prompt's keys and values to positions `[0, n)` of
  its slot. A right-padded `(G, max_len)` batch was the earlier choice: at the
  benchmark's 16-48-token prompts a third of its positions were padding.
- Decode feeds one token per sequence at its own position: keys are written at
  `(slot, position)` and each query attends to positions `[0, position]` of its slot. When
  the running slots are exactly `0..B-1` (the common, full-batch case) the cache is read
  through a view, otherwise through one gather.
- Decode attention folds the GQA group into the query axis: the G = H / Hkv query heads
  of a kv head become G query rows of one SDPA call over that head's cached keys
  (`grouped_decode_attention`), with an additive float mask built once per step. The
  alternative, SDPA with `enable_gqa` and a bool mask, gives the same sums but hands the
  CPU flash kernel one query row per (sequence, head): measured at batch 32 in the
  benchmark's decode step it was 1.2-1.6x slower in bf16 (the kernel's per-block
  overhead dominates at one row) and within noise in fp32 (0.98-1.11x). Explicit
  matmuls were no faster in fp32 and round scores to bf16 in bf16.
- Prefix sharing: the n samples of a prompt are prefilled once, in one slot, and the other
  samples' slots receive a copy of its keys and values (`fork`).
- Capacity (both caches): a slot is `max_model_len` positions long, not the model's own
  context (a Qwen3-0.6B slot at its 40,960 positions is 4.4 GiB in bf16). Unset, the
  served length is the model's context capped at `DEFAULT_MAX_MODEL_LEN`, so a real
  model's default cache holds sequences; a longer context is asked for explicitly. The
  memory budget is `kv_cache_mb`, or `kv_cache_memory_fraction` of the memory free once the
  weights are loaded; a budget that holds not one sequence is refused at the first load
  with the sizes and the keys that change them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.nn.functional as F

from tidal.inference.lazy_zeros import lazy_zeros
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


def slot_bytes(args: DecoderArgs, dtype: torch.dtype, max_len: int | None = None) -> int:
    """Bytes of keys plus values that one slot (one sequence of `max_len` tokens, by default
    the model's context) holds."""
    return token_bytes(args, dtype) * (args.max_seq_len if max_len is None else max_len)


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


def slots_within(
    args: DecoderArgs,
    dtype: torch.dtype,
    *,
    memory_bytes: int,
    max_len: int,
    max_slots: int,
) -> int:
    """How many slots of `max_len` positions fit in `memory_bytes` (at most `max_slots`);
    ValueError naming the keys when not one does."""
    per_slot = slot_bytes(args, dtype, max_len)
    fit = memory_bytes // per_slot
    if fit < 1:
        raise ValueError(
            f"the KV cache's memory ({memory_bytes / 2**20:.2f} MiB, inference.kv_cache_mb or "
            f"kv_cache_memory_fraction) holds no sequence: one slot of max_model_len = "
            f"{max_len} tokens of this model needs {per_slot / 2**20:.2f} MiB; raise "
            "inference.kv_cache_mb (or kv_cache_memory_fraction), lower inference.max_model_len, "
            'or use inference.kv_cache = "paged" (memory follows the tokens held)'
        )
    return int(min(fit, max_slots))


class SlotKVCache:
    """Keys and values of up to `slots` sequences of up to `max_len` tokens (default: the
    model's context)."""

    def __init__(
        self,
        args: DecoderArgs,
        *,
        slots: int,
        dtype: torch.dtype,
        device: Any,
        max_len: int | None = None,
    ) -> None:
        length = args.max_seq_len if max_len is None else max_len
        shape = (args.n_layers, slots, args.n_kv_heads, length, args.head_dim)
        self.k = lazy_zeros(shape, dtype=dtype, device=device)  # (L, N, Hkv, S, D)
        self.v = lazy_zeros(shape, dtype=dtype, device=device)
        self.slots, self.max_len = slots, length
        self._free = list(range(slots - 1, -1, -1))  # a stack: lowest slot on top

    @property
    def used(self) -> int:
        return self.slots - len(self._free)

    @property
    def free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV-cache slot")
        return self._free.pop()

    def release(self, slot: int) -> None:
        self._free.append(slot)
        self._free.sort(reverse=True)  # keep handing out the lowest slots: views stay possible

    def fork(self, source: int, targets: list[int], length: int) -> None:
        """Copy the first `length` positions of slot `source` into each of `targets`."""
        if not targets:
            return
        index = torch.tensor(targets, device=self.k.device)
        for cache in (self.k, self.v):
            prefix = cache[:, source : source + 1, :, :length]  # (L, 1, Hkv, P, D)
            cache[:, index, :, :length] = prefix.expand(-1, len(targets), -1, -1, -1)

    def prefill(self, slots: list[int], lengths: list[int]) -> PrefillAttention:
        return PrefillAttention(self, slots, lengths)

    def decode(self, slots: torch.Tensor, positions: torch.Tensor) -> DecodeAttention:
        return DecodeAttention(self, slots, positions)


class PrefillAttention:
    """Causal attention over prompts packed into one `(1, T)` row, caching each in its slot.

    Prompt i occupies row positions `[starts[i], starts[i] + lengths[i])` and goes to
    positions `[0, lengths[i])` of `slots[i]`. Each prompt attends only to itself (causal
    SDPA per segment), so packing computes exactly what a batch of separate prompts would,
    without the padding a right-padded `(G, max_len)` batch spends on short prompts.
    """

    def __init__(self, cache: SlotKVCache, slots: list[int], lengths: list[int]) -> None:
        self.cache = cache
        self.slots, self.lengths = slots, lengths
        self.starts = [sum(lengths[:i]) for i in range(len(lengths))]

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        outs = []
        for slot, start, n in zip(self.slots, self.starts, self.lengths, strict=True):
            ks, vs = k[0, :, start : start + n], v[0, :, start : start + n]  # (Hkv, n, D)
            self.cache.k[layer, slot, :, :n] = ks
            self.cache.v[layer, slot, :, :n] = vs
            outs.append(
                sdpa(q[:, :, start : start + n], ks[None], vs[None], mask=None, causal=True)
            )  # (1, H, n, D)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (1, H, T, D)


class DecodeAttention:
    """One new token per sequence, at its own position in its own slot."""

    def __init__(self, cache: SlotKVCache, slots: torch.Tensor, positions: torch.Tensor) -> None:
        self.cache = cache
        self.slots = slots  # (B,) long
        self.positions = positions  # (B,) long: where each new token goes
        self.length = int(positions.max()) + 1  # keys read per sequence
        b = len(slots)
        # Slots 0..B-1 in order: read through a view instead of gathering.
        self.contiguous = bool((slots == torch.arange(b, device=slots.device)).all())
        keys = torch.arange(self.length, device=slots.device)
        visible = keys[None, :] <= positions[:, None]  # (B, S)
        # Additive, in the cache dtype, built once per step for all layers: SDPA's CPU
        # kernel adds a float mask directly instead of converting a bool one per call.
        self.mask = torch.zeros(visible.shape, dtype=cache.k.dtype, device=slots.device)
        self.mask.masked_fill_(~visible, float("-inf"))
        self.mask = self.mask[:, None, None, :]  # (B, 1, 1, S), broadcast over heads and rows
        # Rows of the cache viewed as (N * Hkv * S_max, D) that the new keys go to:
        # one index_copy_ per layer, cheaper than a two-tensor advanced-index assignment.
        _, n_kv, s_max, _ = cache.k.shape[1:]
        heads = torch.arange(n_kv, device=slots.device)
        self.rows = (
            (slots[:, None] * n_kv + heads[None, :]) * s_max + positions[:, None]
        ).flatten()

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        ck, cv = self.cache.k[layer], self.cache.v[layer]  # (N, Hkv, S_max, D)
        d = k.shape[-1]
        ck.view(-1, d).index_copy_(0, self.rows, k.reshape(-1, d))  # k: (B, Hkv, 1, D)
        cv.view(-1, d).index_copy_(0, self.rows, v.reshape(-1, d))
        if self.contiguous:
            keys = ck[: len(self.slots), :, : self.length]  # (B, Hkv, S, D), a view
            values = cv[: len(self.slots), :, : self.length]
        else:
            keys = ck[self.slots, :, : self.length]  # (B, Hkv, S, D), gathered
            values = cv[self.slots, :, : self.length]
        return self.attend(q, keys, values)  # (B, H, 1, D)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """q (B, H, 1, D) over this step's keys and values (B, Hkv, S, D) → (B, H, 1, D)."""
        return grouped_decode_attention(q, keys, values, self.mask)


def grouped_decode_attention(
    q: torch.Tensor,  # (B, H, 1, D)
    k: torch.Tensor,  # (B, Hkv, S, D)
    v: torch.Tensor,  # (B, Hkv, S, D)
    mask: torch.Tensor,  # (B, 1, 1, S) additive
) -> torch.Tensor:  # (B, H, 1, D)
    """One query token per sequence, the GQA group folded into the query axis.

    The G = H / Hkv query heads that share a kv head become G query rows of that head, so
    SDPA runs without `enable_gqa` on k and v as they are (no expanded copy) and sees G
    rows per (sequence, kv head) instead of one. Exactly the same sums as GQA attention.
    """
    b, h, _, d = q.shape
    n_kv = k.shape[1]
    grouped = q.reshape(b, n_kv, h // n_kv, d)  # (B, Hkv, G, D): head j*G + g -> (j, g)
    out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask)  # (B, Hkv, G, D)
    return out.reshape(b, h, 1, d)
