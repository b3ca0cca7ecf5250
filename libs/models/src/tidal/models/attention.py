"""Attention backends: the one seam between the model code and how tokens see each other.

A layer computes q, k, v and applies RoPE; which keys each query sees, and where keys
come from, is the backend's: packed rows in training, a KV cache in inference, ring or
Ulysses attention under context parallelism. So one model serves trainer and inference.
A backend is `(layer, q (B, H, T, D), k, v (B, Hkv, T, D)) -> (B, H, T, D)`. Packed rows
run `PaddedCausalAttention` (length buckets of right-padded samples, a few SDPA calls)
or flash-attn's varlen kernel, by `model.attn`; `PackedCausalAttention`, one SDPA call
per sample (the dense mask where samples share a prefix), is the plain reference both
are tested against. A sample may continue a parent sample (`sample_parents`, a group's
shared prompt): it then sees the parent's tokens before its own. No silent fallback.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
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


def packed_causal_mask(
    sample_lengths: torch.Tensor, total: int, sample_parents: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal mask `[1, 1, T, T]` (True = attend) of packed samples: block-diagonal, plus
    every token of a sample with a parent (`sample_parents[s] >= 0`) seeing all the
    parent's tokens (the parent precedes it in the row)."""
    seg = torch.repeat_interleave(
        torch.arange(len(sample_lengths), device=sample_lengths.device), sample_lengths
    )  # (T,)
    if seg.numel() != total:
        raise ValueError(f"sample_lengths sum to {seg.numel()}, but the batch has {total} tokens")
    causal = torch.ones(total, total, dtype=torch.bool, device=seg.device).tril()
    allowed = (seg[:, None] == seg[None, :]) & causal  # (T, T)
    if sample_parents is not None:
        parent = sample_parents.to(seg.device)[seg]  # (T,) parent sample of each token's
        allowed |= parent[:, None] == seg[None, :]
    return allowed[None, None]


def check_sample_parents(lengths: list[int], parents: list[int]) -> None:
    """Raise ValueError unless each parent precedes its child and has no parent itself."""
    if len(parents) != len(lengths):
        raise ValueError(f"{len(parents)} sample_parents for {len(lengths)} samples")
    for s, p in enumerate(parents):
        if p >= s or p < -1:
            raise ValueError(f"sample {s}'s parent {p} must be -1 or an earlier sample")
        if p >= 0 and parents[p] >= 0:
            raise ValueError(f"sample {s}'s parent {p} has a parent itself (one level only)")


def token_multiplicity(sample_lengths: torch.Tensor, sample_parents: torch.Tensor) -> torch.Tensor:
    """(T,) float: how many samples of the unshared row each token stands for (a parent's
    tokens its children's count, every other token 1)."""
    children = torch.bincount(
        sample_parents[sample_parents >= 0], minlength=len(sample_lengths)
    )  # (S,)
    per_sample = torch.where(children > 0, children, 1).to(torch.float32)  # (S,)
    return torch.repeat_interleave(per_sample, sample_lengths)


class PackedCausalAttention:
    """Samples of lengths `sample_lengths` concatenated along one `[1, T]` row.

    Computed per segment (causal SDPA over each sample's slice): Σ Lᵢ² work instead of
    T², no `T×T` mask, the `is_causal` kernels. The block-diagonal mask it equals stays
    available as `.mask` for callers that need a mask (transformers' models).
    """

    def __init__(
        self,
        sample_lengths: torch.Tensor,
        total: int,
        *,
        sample_parents: torch.Tensor | None = None,
    ) -> None:
        self.lengths = [int(n) for n in sample_lengths.tolist()]  # one host sync per batch
        if sum(self.lengths) != total:
            raise ValueError(
                f"sample_lengths sum to {sum(self.lengths)}, but the batch has {total} tokens"
            )
        self.parents = [-1] * len(self.lengths)
        if sample_parents is not None:
            self.parents = [int(p) for p in sample_parents.tolist()]
            check_sample_parents(self.lengths, self.parents)
        self._sample_lengths, self._total = sample_lengths, total
        self._sample_parents = sample_parents if max(self.parents) >= 0 else None

    @property
    def mask(self) -> torch.Tensor:
        """Causal mask `[1, 1, T, T]` (True = attend), block-diagonal but for parents."""
        return packed_causal_mask(self._sample_lengths, self._total, self._sample_parents)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if self._sample_parents is not None:  # the reference: one dense-mask call
            return sdpa(q, k, v, mask=self.mask.to(q.device), causal=False)
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


@dataclass(frozen=True)
class _Bucket:
    """One SDPA call: n right-padded rows of m queries over `prefix` + m keys each."""

    n: int
    m: int
    prefix: int  # the parent's length; 0 for samples without a parent
    mask: torch.Tensor | None  # (m, prefix + m) bottom-right causal; None: plain causal


class PaddedCausalAttention(PackedCausalAttention):
    """Packed samples as right-padded batches in length buckets: a few SDPA calls per
    layer instead of one per sample. Samples without a parent are bucketed together, each
    parent's children apart: a child's keys are its parent's tokens then its own, under a
    bottom-right causal mask. Right padding needs no mask: under the causal rule a real
    query never sees a later (padded) key, and padded queries are dropped on the way
    back, so values and gradients equal the reference's."""

    def __init__(
        self,
        sample_lengths: torch.Tensor,
        total: int,
        *,
        sample_parents: torch.Tensor | None = None,
        pad_factor: float = PAD_FACTOR,
    ) -> None:
        super().__init__(sample_lengths, total, sample_parents=sample_parents)
        lengths, device = self.lengths, sample_lengths.device
        starts = [0] * len(lengths)
        for i in range(1, len(lengths)):
            starts[i] = starts[i - 1] + lengths[i - 1]
        families: dict[int, list[int]] = {}  # parent (-1: none) → its samples, in row order
        for s, parent in enumerate(self.parents):
            families.setdefault(parent, []).append(s)
        self.buckets: list[_Bucket] = []
        queries: list[torch.Tensor] = []
        keys: list[torch.Tensor] = []
        inverse = torch.empty(total, dtype=torch.long)  # (T,) token → row of the padded rows
        offset = 0
        for parent, members in families.items():
            for bucket in length_buckets([lengths[s] for s in members], pad_factor):
                samples = [members[i] for i in bucket]
                n, m = len(samples), lengths[samples[0]]
                first = torch.tensor([starts[s] for s in samples])  # (n,)
                count = torch.tensor([lengths[s] for s in samples])  # (n,)
                step = torch.arange(m)  # (m,)
                # Padding rows point at their sample's first token: any real token would
                # do, nothing real attends to them and their outputs are dropped.
                own = first[:, None] + torch.where(step[None] < count[:, None], step[None], 0)
                queries.append(own.reshape(-1))  # (n·m,)
                prefix, mask = 0, None
                if parent >= 0:
                    prefix = lengths[parent]
                    shared = torch.arange(starts[parent], starts[parent] + prefix)  # (prefix,)
                    own = torch.cat([shared.expand(n, prefix), own], dim=1)  # (n, prefix + m)
                    mask = torch.ones(m, prefix + m, dtype=torch.bool).tril(prefix).to(device)
                keys.append(own.reshape(-1))  # (n·(prefix + m),)
                for row, s in enumerate(samples):
                    base = offset + row * m
                    inverse[starts[s] : starts[s] + lengths[s]] = torch.arange(
                        base, base + lengths[s]
                    )
                self.buckets.append(_Bucket(n, m, prefix, mask))
                offset += n * m
        self.query_gather = torch.cat(queries).to(device)  # (Q,) Q = Σ n·m
        self.key_gather = torch.cat(keys).to(device) if self._sample_parents is not None else None
        self.inverse = inverse.to(device)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if len(self.lengths) == 1:
            return sdpa(q, k, v, mask=None, causal=True)
        if q.shape[0] != 1:
            raise ValueError(f"packed attention takes one [1, T] row, got batch {q.shape[0]}")
        query_gather = self.query_gather.to(q.device)
        key_gather = query_gather if self.key_gather is None else self.key_gather.to(q.device)
        # Token-major (T, H, D) views: the projections' own memory layout, so no copy here.
        q_rows = q[0].transpose(0, 1).index_select(0, query_gather)  # (Q, H, D)
        k_rows, v_rows = (t[0].transpose(0, 1).index_select(0, key_gather) for t in (k, v))
        outs, at_q, at_k = [], 0, 0
        for b in self.buckets:
            width = b.prefix + b.m
            qb = q_rows[at_q : at_q + b.n * b.m].view(b.n, b.m, *q_rows.shape[1:]).transpose(1, 2)
            kb, vb = (
                r[at_k : at_k + b.n * width].view(b.n, width, *r.shape[1:]).transpose(1, 2)
                for r in (k_rows, v_rows)
            )  # (n, Hkv, prefix + m, D)
            mask = None if b.mask is None else b.mask.to(q.device)
            out = sdpa(qb, kb, vb, mask=mask, causal=mask is None)  # (n, H, m, D)
            outs.append(out.transpose(1, 2).reshape(b.n * b.m, out.shape[1], out.shape[3]))
            at_q, at_k = at_q + b.n * b.m, at_k + b.n * width
        padded = outs[0] if len(outs) == 1 else torch.cat(outs)  # (Q, H, D)
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
    kind: PackedKind,
    sample_lengths: torch.Tensor,
    total: int,
    sample_parents: torch.Tensor | None = None,
) -> AttentionBackend:
    """The backend isolating packed samples of one `[1, T]` row, by `model.attn`."""
    if kind == "flash_attention_2":
        if sample_parents is not None and bool((sample_parents >= 0).any()):
            raise ValueError(
                'model.attn = "flash_attention_2" does not train samples that share a '
                'prefix (sample_parents); use model.attn = "sdpa"'
            )
        return FlashVarlenAttention(sample_lengths, total)
    return PaddedCausalAttention(sample_lengths, total, sample_parents=sample_parents)
