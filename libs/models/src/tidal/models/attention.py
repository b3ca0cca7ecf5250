"""Attention backends: the one seam between the model code and how tokens see each other.

A layer computes q, k, v and applies RoPE; which keys each query sees, and where keys
come from, is the backend's: packed rows in training, a KV cache in inference, ring or
Ulysses attention under context parallelism. So one model serves trainer and inference.
A backend is `(layer, q (B, H, T, D), k, v (B, Hkv, T, D)) -> (B, H, T, D)`. Packed rows
run `PaddedCausalAttention` (length buckets of right-padded samples, a few SDPA calls)
or flash-attn's varlen kernel, by `model.attn`; `PackedCausalAttention`, one SDPA call
per sample, is the plain reference both are tested against. No silent fallback.
"""

from __future__ import annotations

import importlib.util
from typing import Protocol

import torch
import torch.nn.functional as F

from tidal.models.attention_kind import FLASH_ATTN_INSTALL, PackedKind


class AttentionBackend(Protocol):
    def __call__(
        self,
        layer: int,
        q: torch.Tensor,  # (B, H, T, D), RoPE applied
        k: torch.Tensor,  # (B, Hkv, T, D), RoPE applied
        v: torch.Tensor,  # (B, Hkv, T, D)
    ) -> torch.Tensor:  # (B, H, T, D)
        ...


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """SDPA with GQA; `mask` is bool (True = attend), broadcastable to (B, H, T, S).

    bf16 inputs on CPU that will be differentiated run in fp32 (autocast off) and come
    back as bf16: torch's CPU flash-attention backward is much slower in bf16 than in
    fp32 (docs/models.md), while the upcast costs only a copy of q, k, v. Results stay
    within bf16 rounding of the plain bf16 call. Inference (no grad) keeps the bf16 kernel.
    """
    if q.device.type == "cpu" and q.requires_grad and _bf16_compute(q):
        with torch.autocast("cpu", enabled=False):
            out = _sdpa(q.float(), k.float(), v.float(), mask=mask, causal=causal)
        return out.to(torch.bfloat16)
    return _sdpa(q, k, v, mask=mask, causal=causal)


def _bf16_compute(q: torch.Tensor) -> bool:
    """SDPA would run in bf16: bf16 inputs, or fp32 ones that CPU autocast casts to bf16."""
    if q.dtype == torch.bfloat16:
        return True
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=causal and mask is None,
        enable_gqa=q.shape[1] != k.shape[1],
    )


class CausalAttention:
    """Every row is one sequence starting at position 0: plain causal attention."""

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        return sdpa(q, k, v, mask=None, causal=True)


def packed_causal_mask(sample_lengths: torch.Tensor, total: int) -> torch.Tensor:
    """Block-diagonal causal mask `[1, 1, T, T]` (True = attend) for packed samples."""
    seg = torch.repeat_interleave(
        torch.arange(len(sample_lengths), device=sample_lengths.device), sample_lengths
    )  # (T,)
    if seg.numel() != total:
        raise ValueError(f"sample_lengths sum to {seg.numel()}, but the batch has {total} tokens")
    same = seg[:, None] == seg[None, :]
    causal = torch.ones(total, total, dtype=torch.bool, device=seg.device).tril()
    return (same & causal)[None, None]


class PackedCausalAttention:
    """Samples of lengths `sample_lengths` concatenated along one `[1, T]` row.

    Computed per segment (causal SDPA over each sample's slice): Σ Lᵢ² work instead of
    T², no `T×T` mask, the `is_causal` kernels. The block-diagonal mask it equals stays
    available as `.mask` for callers that need a mask (transformers' models).
    """

    def __init__(self, sample_lengths: torch.Tensor, total: int) -> None:
        self.lengths = [int(n) for n in sample_lengths.tolist()]  # one host sync per batch
        if sum(self.lengths) != total:
            raise ValueError(
                f"sample_lengths sum to {sum(self.lengths)}, but the batch has {total} tokens"
            )
        self._sample_lengths, self._total = sample_lengths, total

    @property
    def mask(self) -> torch.Tensor:
        """Block-diagonal causal mask `[1, 1, T, T]` (True = attend)."""
        return packed_causal_mask(self._sample_lengths, self._total)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if len(self.lengths) == 1:
            return sdpa(q, k, v, mask=None, causal=True)
        outs, start = [], 0
        for n in self.lengths:
            end = start + n
            outs.append(
                sdpa(
                    q[:, :, start:end],
                    k[:, :, start:end],
                    v[:, :, start:end],
                    mask=None,
                    causal=True,
                )
            )
            start = end
        return torch.cat(outs, dim=2)  # (B, H, T, D)


PAD_FACTOR = 2.0
"""A bucket's padded tokens are at most this many times its real tokens."""


def length_buckets(lengths: list[int], pad_factor: float = PAD_FACTOR) -> list[list[int]]:
    """Sample indices grouped longest first; a bucket of n samples padded to its longest
    m keeps n·m ≤ pad_factor · (its real tokens)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    real = 0
    for i in order:
        if buckets:
            longest = lengths[buckets[-1][0]]
            if (len(buckets[-1]) + 1) * longest <= pad_factor * (real + lengths[i]):
                buckets[-1].append(i)
                real += lengths[i]
                continue
        buckets.append([i])
        real = lengths[i]
    return buckets


class PaddedCausalAttention(PackedCausalAttention):
    """Packed samples as right-padded batches in length buckets: a few SDPA calls per
    layer instead of one per sample. Right padding needs no mask: under the causal rule
    a real query never sees a later (padded) key, and padded queries are dropped on the
    way back, so values and gradients equal the per-sample loop's."""

    def __init__(
        self, sample_lengths: torch.Tensor, total: int, *, pad_factor: float = PAD_FACTOR
    ) -> None:
        super().__init__(sample_lengths, total)
        lengths = self.lengths
        starts = [0] * len(lengths)
        for i in range(1, len(lengths)):
            starts[i] = starts[i - 1] + lengths[i - 1]
        device = sample_lengths.device
        self.shapes: list[tuple[int, int]] = []  # (n samples, padded length m) per bucket
        gather: list[torch.Tensor] = []
        inverse = torch.empty(total, dtype=torch.long)  # (T,) token → row of the padded rows
        offset = 0
        for bucket in length_buckets(lengths, pad_factor):
            n, m = len(bucket), lengths[bucket[0]]
            first = torch.tensor([starts[i] for i in bucket])  # (n,)
            count = torch.tensor([lengths[i] for i in bucket])  # (n,)
            step = torch.arange(m)  # (m,)
            # Padding rows point at their sample's first token: any real token would do,
            # nothing real attends to them and their outputs are dropped.
            index = first[:, None] + torch.where(step[None] < count[:, None], step[None], 0)
            gather.append(index.reshape(-1))  # (n·m,)
            for row, i in enumerate(bucket):
                base = offset + row * m
                inverse[starts[i] : starts[i] + lengths[i]] = torch.arange(base, base + lengths[i])
            self.shapes.append((n, m))
            offset += n * m
        self.gather = torch.cat(gather).to(device)  # (P,) P = Σ n·m
        self.inverse = inverse.to(device)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if len(self.lengths) == 1:
            return sdpa(q, k, v, mask=None, causal=True)
        if q.shape[0] != 1:
            raise ValueError(f"packed attention takes one [1, T] row, got batch {q.shape[0]}")
        gather = self.gather.to(q.device)
        # Token-major (T, H, D) views: the projections' own memory layout, so no copy here.
        rows = [t[0].transpose(0, 1).index_select(0, gather) for t in (q, k, v)]  # (P, H*, D)
        outs, offset = [], 0
        for n, m in self.shapes:
            qb, kb, vb = (
                r[offset : offset + n * m].view(n, m, r.shape[1], r.shape[2]).transpose(1, 2)
                for r in rows
            )  # (n, H*, m, D)
            out = sdpa(qb, kb, vb, mask=None, causal=True)  # (n, H, m, D)
            outs.append(out.transpose(1, 2).reshape(n * m, out.shape[1], out.shape[3]))
            offset += n * m
        padded = outs[0] if len(outs) == 1 else torch.cat(outs)  # (P, H, D)
        return padded.index_select(0, self.inverse.to(q.device)).transpose(0, 1)[None]


class FlashVarlenAttention:
    """Packed samples through `flash_attn_varlen_func` (flash-attn 2, CUDA, fp16/bf16)."""

    def __init__(self, sample_lengths: torch.Tensor, total: int) -> None:
        from flash_attn import flash_attn_varlen_func  # optional extra; checked by the caller

        covered = int(sample_lengths.sum())
        if covered != total:
            raise ValueError(f"sample_lengths sum to {covered}, but the batch has {total} tokens")
        self._varlen = flash_attn_varlen_func
        lengths = sample_lengths.to(torch.int32)
        self.cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))  # (S+1,)
        self.max_len = int(lengths.max())

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if q.shape[0] != 1:
            raise ValueError(f"packed attention takes one [1, T] row, got batch {q.shape[0]}")
        cu = self.cu_seqlens.to(q.device)
        out = self._varlen(
            q[0].transpose(0, 1),  # (T, H, D)
            k[0].transpose(0, 1),  # (T, Hkv, D)
            v[0].transpose(0, 1),
            cu,
            cu,
            self.max_len,
            self.max_len,
            causal=True,
        )  # (T, H, D)
        return out.transpose(0, 1)[None]  # (1, H, T, D)


def check_packed_kind(kind: PackedKind, device: torch.device | str) -> None:
    """Raise ValueError when `kind` cannot run here (flash-attn missing, or not on CUDA)."""
    if kind == "sdpa":
        return
    if kind != "flash_attention_2":
        raise ValueError(f'model.attn {kind!r} is unknown; supported: "sdpa", "flash_attention_2"')
    if importlib.util.find_spec("flash_attn") is None:
        raise ValueError(
            'model.attn = "flash_attention_2" needs the flash-attn package, which is not '
            f'installed ({FLASH_ATTN_INSTALL}); or use model.attn = "sdpa"'
        )
    if torch.device(device).type != "cuda":
        raise ValueError(
            f'model.attn = "flash_attention_2" runs on CUDA only, the model is on {device}; '
            'use model.attn = "sdpa"'
        )


def packed_attention(
    kind: PackedKind, sample_lengths: torch.Tensor, total: int
) -> AttentionBackend:
    """The backend isolating packed samples of one `[1, T]` row, by `model.attn`."""
    if kind == "flash_attention_2":
        return FlashVarlenAttention(sample_lengths, total)
    return PaddedCausalAttention(sample_lengths, total)
