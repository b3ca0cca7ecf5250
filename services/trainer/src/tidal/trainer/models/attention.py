"""Attention backends: the one seam between the model code and how tokens see each other.

Decisions:
- A decoder layer computes q, k, v and applies RoPE; *which keys each query sees, and
  where keys come from* is the backend's job. Training passes a packed (block-diagonal
  causal) backend, inference passes a backend that owns its KV cache, context
  parallelism can pass a ring/Ulysses backend. The model never learns about caches,
  masks or communication, so one model implementation serves trainer and inference.
- A backend is a callable `(layer, q, k, v) -> out` with q `(B, H, T, D)` and k, v
  `(B, Hkv, T, D)` *after* RoPE; it returns `(B, H, T, D)`. GQA expansion is the
  backend's choice (SDPA's `enable_gqa` does it without a copy).
- The default is plain causal attention over the given tokens; `PackedCausalAttention`
  isolates samples concatenated along one `[1, T]` row (padding-free packing) with a
  block-diagonal causal mask through SDPA, which has a backward on CPU and GPU.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


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
    """SDPA with GQA; `mask` is bool (True = attend), broadcastable to (B, H, T, S)."""
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
    """Samples of lengths `sample_lengths` concatenated along one `[1, T]` row."""

    def __init__(self, sample_lengths: torch.Tensor, total: int) -> None:
        self.mask = packed_causal_mask(sample_lengths, total)  # (1, 1, T, T), built once

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        return sdpa(q, k, v, mask=self.mask, causal=False)
