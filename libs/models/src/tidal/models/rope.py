"""Rotary position embeddings: inverse frequencies (plain, linear- or Llama-3-scaled) and tables.

Tables `(max_seq_len, head_dim)` are computed once in fp32 and indexed by `position_ids`,
so packed rows (positions restarting per sample) cost a gather and a bf16 model still
rotates with fp32-exact angles. HF's rotate-half layout, so weights need no permutation.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tidal.models.args import DecoderArgs, RopeScaling


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None, device: Any = None
) -> torch.Tensor:
    """(head_dim / 2,) fp32 inverse frequencies after scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # (D/2,)
    if scaling is None or scaling.type == "default":
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    return _llama3_scaled(inv_freq, scaling)


def _llama3_scaled(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are slowed down by `factor`; short ones are kept.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(args: DecoderArgs, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: `(max_seq_len, head_dim)` fp32 in HF's rotate-half layout."""
    inv_freq = inverse_frequencies(args.head_dim, args.rope_theta, args.rope_scaling, device)
    t = torch.arange(args.max_seq_len, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)  # (S, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (S, D)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin: (B, 1, T, D)."""
    return x * cos + _rotate_half(x) * sin
