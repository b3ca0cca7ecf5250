"""Decode attention: one query token per sequence over its cached keys, two kernels.

Both read one layer of the paged cache (keys `(NB, Hkv, D, BS)`, values `(NB * BS, Hkv,
D)`, see kv_cache.py) through each sequence's block table. `SdpaDecode` gathers every
sequence's keys and values into contiguous tensors and calls SDPA with the GQA group
folded into the query axis; at decode's shapes (a few query rows over tens of keys per
sequence and kv head) SDPA's CPU kernel spends most of its time setting up each pair, and
the gather copies the keys first. `NativeDecode` reads the blocks in place with
paged_decode.cpp, compiled for this CPU: torch has no paged attention for CPU, and
Inductor does not vectorize loads through a block table. The kernel is chosen once per
engine (`inference.compile_attention`); a build that fails falls back to SDPA with a
warning, so a replica never stops serving for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from tidal.inference.native_decode import DTYPE_CODES, PagedDecodeLibrary, build

log = logging.getLogger(__name__)


@dataclass
class BlockReads:
    """What one decode step reads: sequence b's positions `[0, positions[b]]`, position p
    in block `table[b, p // block_size]` at offset `p % block_size`."""

    table: torch.Tensor  # (B, W) int64; rows padded with block 0, never read unmasked
    positions: torch.Tensor  # (B,) int64
    block_size: int
    span: int  # longest sequence's keys: max(positions) + 1
    in_step: bool  # every sequence at the same position (a group decoding together)
    _masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """(B, 1, 1, span): 0 where a key is the sequence's own, -inf past it; None when
        every key read is (sequences in step). Built once per step, for every layer."""
        if self.in_step:
            return None
        if dtype not in self._masks:
            keys = torch.arange(self.span, device=self.positions.device)
            visible = keys[None, :] <= self.positions[:, None]  # (B, span)
            mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
            self._masks[dtype] = mask.masked_fill_(~visible, float("-inf"))[:, None, None, :]
        return self._masks[dtype]


class DecodeKernel(Protocol):
    """q (B, H, 1, D) over one layer's cached keys (NB, Hkv, D, BS) and values
    (NB * BS, Hkv, D), read as `reads` says → (B, H, 1, D) in q's dtype."""

    @property
    def name(self) -> str:
        """What runs, for the log and `GetStatus.kernels`."""
        ...

    def warm_up(self, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Prepare for a model of these shapes before serving it."""
        ...

    def __call__(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, reads: BlockReads
    ) -> torch.Tensor: ...


def gather(
    keys: torch.Tensor, values: torch.Tensor, reads: BlockReads
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's first `span` keys and values, (B, Hkv, span, D) each, copied out of
    whole blocks (one `index_select` per cache, then the keys' position axis moved in)."""
    batch, width = reads.table.shape
    n_blocks, n_kv, d, bs = keys.shape
    blocks = reads.table.flatten()  # (B * W,)
    k = keys.index_select(0, blocks).view(batch, width, n_kv, d, bs)
    k = k.permute(0, 2, 1, 4, 3).reshape(batch, n_kv, width * bs, d)[:, :, : reads.span]
    v = values.view(n_blocks, -1).index_select(0, blocks).view(batch, width * bs, n_kv, d)
    return k, v[:, : reads.span].transpose(1, 2)


class SdpaDecode:
    """SDPA on the gathered keys, with the G = H / Hkv query heads that share a kv head as
    G query rows of it: no expanded copy of k and v, exactly the sums of GQA attention."""

    name = "sdpa"

    def warm_up(self, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        pass  # torch's own kernel: nothing to prepare

    def __call__(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, reads: BlockReads
    ) -> torch.Tensor:
        k, v = gather(keys, values, reads)  # (B, Hkv, span, D)
        b, h, _, d = q.shape
        grouped = q.reshape(b, k.shape[1], h // k.shape[1], d)  # head j*G + g → row g of j
        mask = reads.additive_mask(q.dtype)
        return F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask).reshape(b, h, 1, d)


sdpa_decode = SdpaDecode()


class NativeDecode:
    """paged_decode.cpp: scores, softmax and the weighted sum in fp32 from the bf16 or
    fp32 cache, at least as exact as SDPA's bf16 kernel, on one thread. Built at
    `warm_up` (or the first call); a cache dtype it does not compute (fp16) takes SDPA."""

    def __init__(self) -> None:
        self._library: PagedDecodeLibrary | None = None
        self._failed = False

    @property
    def name(self) -> str:
        return "sdpa (native build failed)" if self._failed else "native paged"

    def warm_up(self, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self._load()

    def _load(self) -> PagedDecodeLibrary | None:
        """The built kernel, built on first use; None once a build has failed."""
        if self._library is None and not self._failed:
            try:
                self._library = PagedDecodeLibrary(build())
            except (RuntimeError, OSError) as exc:
                self._failed = True
                log.warning(
                    "inference.compile_attention: building the decode-attention kernel failed "
                    "(%s); decode attention runs on SDPA",
                    exc,
                )
        return self._library

    def __call__(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, reads: BlockReads
    ) -> torch.Tensor:
        library = self._load()
        if library is None or keys.dtype not in DTYPE_CODES:
            return sdpa_decode(q, keys, values, reads)
        query = q.to(keys.dtype).contiguous()  # (B, H, 1, D) in the cache's dtype
        with torch.profiler.record_function("tidal::paged_decode"):  # named in profiles
            out = library.attend(query, keys, values, reads.table, reads.positions)
        return out.to(q.dtype)


def native_decode_pays() -> bool:
    """Whether the native kernel is measured to be the faster one on this CPU: at torch's
    AVX-512 or AVX2 capability (docs/benchmarks/inference.md). Below AVX2 and on non-x86
    CPUs it is unmeasured, and SDPA serves."""
    capability = torch.backends.cpu.get_cpu_capability()
    return capability.startswith("AVX512") or capability == "AVX2"


def choose_decode_attention(device: torch.device, *, compile_attention: bool) -> DecodeKernel:
    """The engine's decode attention: the native kernel where asked for on a CPU where it
    pays, else SDPA."""
    if compile_attention and device.type == "cpu" and native_decode_pays():
        return NativeDecode()
    return sdpa_decode
