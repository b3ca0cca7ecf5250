"""Decode attention: one query token per sequence over its gathered keys, two kernels.

`sdpa_decode` folds the GQA group into the query axis and calls SDPA. At decode's shapes
(a few query rows over tens of keys per sequence and kv head) SDPA's CPU kernel spends
most of its time setting up each (sequence, kv head) pair, not computing. `InductorDecode`
computes the same sums in fp32 as one loop nest that `torch.compile` generates for all
pairs at once, at the cost of a compile on first use and a C++ compiler. The kernel is
chosen once per engine (`inference.compile_attention`); a compile that fails falls back
to SDPA with a warning, so a replica never stops serving for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from tidal.models.cpu_features import inductor_cache_per_isa

log = logging.getLogger(__name__)


class DecodeKernel(Protocol):
    """q (B, H, 1, D) over keys and values (B, Hkv, S, D), additive mask (B, 1, 1, S) or
    None (every key visible) → (B, H, 1, D) in q's dtype."""

    @property
    def name(self) -> str:
        """What runs, for the log and `GetStatus.kernels`."""
        ...

    def warm_up(self, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Prepare for a model of these shapes before serving it."""
        ...

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor: ...


def _grouped(q: torch.Tensor, n_kv: int) -> torch.Tensor:
    """(B, H, 1, D) → (B, Hkv, G, D): head j*G + g becomes query row g of kv head j."""
    b, h, _, d = q.shape
    return q.reshape(b, n_kv, h // n_kv, d)


class SdpaDecode:
    """SDPA with the G = H / Hkv query heads that share a kv head as G query rows of it:
    no expanded copy of k and v, exactly the sums of GQA attention."""

    name = "sdpa"

    def warm_up(self, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        pass  # torch's own kernel: nothing to prepare

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        b, h, _, d = q.shape
        out = F.scaled_dot_product_attention(_grouped(q, k.shape[1]), k, v, attn_mask=mask)
        return out.reshape(b, h, 1, d)  # (B, Hkv, G, D) → (B, H, 1, D)


sdpa_decode = SdpaDecode()


def _fp32_attention(
    q: torch.Tensor,  # (B, Hkv, G, D)
    k: torch.Tensor,  # (B, Hkv, S, D)
    v: torch.Tensor,  # (B, Hkv, S, D)
    mask: torch.Tensor | None,  # (B, 1, 1, S) additive
) -> torch.Tensor:  # (B, Hkv, G, D), q's dtype
    scale = q.shape[-1] ** -0.5
    scores = (q.float().unsqueeze(3) * k.float().unsqueeze(2)).sum(-1) * scale  # (B, Hkv, G, S)
    if mask is not None:
        scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1)
    return (probs.unsqueeze(-1) * v.float().unsqueeze(2)).sum(3).to(q.dtype)


class InductorDecode:
    """`_fp32_attention` compiled with dynamic shapes (batch and key length vary every
    step); scores, softmax and the weighted sum stay in fp32, so it is at least as exact
    as SDPA's bf16 kernel. Falls back to SDPA for good if compiling fails. Called from the
    engine's one worker thread only, as every forward is: no lock around the compile."""

    def __init__(self, compiler: Callable[..., Any] = torch.compile) -> None:
        """`compiler` wraps the attention function as `torch.compile` does (lazily: the
        work happens at the first call)."""
        inductor_cache_per_isa()
        self._compiled: Any = compiler(_fp32_attention, dynamic=True)
        self._failed = False

    @property
    def name(self) -> str:
        return "sdpa (inductor compile failed)" if self._failed else "inductor"

    def warm_up(self, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Compile both variants (with and without a mask) now, at sizes no model
        dimension shares, so serving never waits on a compile (Dynamo would treat equal
        sizes as one symbol and compile again when they differ)."""
        batch, keys, read = 5, 7, 11
        # Laid out as decode passes them (grad mode, k's strides and the mask's are all in
        # Dynamo's guards): keys are a (B, read, Hkv, D) gather cut to `keys` positions.
        with torch.inference_mode():
            q = torch.zeros(batch, heads, 1, head_dim, dtype=dtype)
            k, v = (
                torch.zeros(batch, read, kv_heads, head_dim, dtype=dtype)[:, :keys].transpose(1, 2)
                for _ in range(2)
            )  # (B, Hkv, keys, D) each, distinct tensors as in decode
            mask = torch.zeros(batch, keys, dtype=dtype)[:, None, None, :]  # (B, 1, 1, keys)
            self(q, k, v, None)
            self(q, k, v, mask)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        if self._failed or q.shape[0] < 2 or k.shape[2] < 2:
            # A dimension of 1 is one Dynamo would specialize on and compile again for;
            # a single sequence or key is no work worth a kernel of its own.
            return sdpa_decode(q, k, v, mask)
        b, h, _, d = q.shape
        try:
            out = self._compiled(_grouped(q, k.shape[1]), k, v, mask)
        except Exception as exc:  # any compile failure (no compiler, Inductor error): SDPA
            self._failed = True
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            log.warning(
                "inference.compile_attention: compiling decode attention failed (%s); "
                "decode attention runs on SDPA",
                first,
            )
            return sdpa_decode(q, k, v, mask)
        return out.reshape(b, h, 1, d)


def choose_decode_attention(device: torch.device, *, compile_attention: bool) -> DecodeKernel:
    """The engine's decode attention: Inductor's where asked for on CPU, else SDPA."""
    if compile_attention and device.type == "cpu":
        return InductorDecode()
    return sdpa_decode
