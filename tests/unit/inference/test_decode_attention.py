"""Both decode-attention kernels compute GQA attention of one query token per sequence
over its own cached positions, read through block tables.

Each is checked against torch's own GQA SDPA with a bool mask, on a cache whose blocks
are scattered and partly filled, with sequences at different positions and in step, in
fp32 and bf16, at the group and head sizes the native kernel has instantiated and at
ones it has not (its generic loops). The native one must be at least as close to float64
as SDPA's own bf16 kernel. A build that fails leaves the engine serving on SDPA, named
so in its status; an engine on the native kernel serves the cache-free model's tokens
and logprobs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tidal.inference import decode_attention
from tidal.inference.decode_attention import (
    BlockReads,
    DecodeKernel,
    NativeDecode,
    choose_decode_attention,
    native_decode_pays,
    sdpa_decode,
)
from tidal.inference.sampling import SamplingParams

from .test_engine import PROMPTS

ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
ENGINE_KERNEL = "native paged" if native_decode_pays() else "sdpa"  # what an engine picks here


@pytest.fixture(scope="module")
def native() -> NativeDecode:
    """One kernel for the module: its build (cached on disk) is the slow part."""
    kernel = NativeDecode()
    kernel.warm_up(heads=4, kv_heads=2, head_dim=16, dtype=torch.float32)
    return kernel


def paged_inputs(
    dtype: torch.dtype, n_heads: int, n_kv_heads: int, d: int, block_size: int, *, in_step: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, BlockReads, torch.Tensor, torch.Tensor]:
    """q (B, H, 1, D), one layer's keys (NB, Hkv, D, BS) and values (NB * BS, Hkv, D), the
    step's reads, and each sequence's own keys and values gathered by hand (B, Hkv, S, D)
    with the bool mask (B, S) of its positions."""
    torch.manual_seed(0)
    n_blocks = 24
    keys = torch.randn(n_blocks, n_kv_heads, d, block_size, dtype=dtype)
    values = torch.randn(n_blocks * block_size, n_kv_heads, d, dtype=dtype)
    positions = [37, 37, 37] if in_step else [37, 0, block_size - 1, block_size, 20]
    span = max(positions) + 1
    width = -(-span // block_size)
    order = torch.randperm(n_blocks - 1) + 1  # scattered, block 0 left as the padding
    tables = [
        order[i * width : i * width + p // block_size + 1].tolist() for i, p in enumerate(positions)
    ]
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables])  # (B, W)
    reads = BlockReads(
        table=table,
        positions=torch.tensor(positions),
        block_size=block_size,
        span=span,
        in_step=in_step,
    )
    rows = table[:, torch.arange(span) // block_size] * block_size + torch.arange(span) % block_size
    k = keys.permute(0, 3, 1, 2).reshape(-1, n_kv_heads, d)[rows].transpose(1, 2)  # (B, Hkv, S, D)
    v = values[rows].transpose(1, 2)
    visible = torch.arange(span)[None, :] <= reads.positions[:, None]  # (B, S)
    q = torch.randn(len(positions), n_heads, 1, d, dtype=dtype)
    return q, keys, values, reads, torch.stack([k, v]), visible


SHAPES = [  # (heads, kv heads, head dim, block size)
    (9, 3, 64, 16),  # SmolLM2's: an instantiated group and head size
    (4, 2, 32, 16),  # the default config's tiny model: instantiated too
    (4, 2, 16, 16),  # the engine test's tiny model: head dim 16 takes the generic loops
    (8, 8, 128, 16),  # multi-head, head dim 128
    (16, 2, 128, 16),  # a group of 8 at head dim 128: accumulator tiles taken in passes
    (12, 1, 32, 8),  # a group of 12, blocks of 8: generic
]


@pytest.mark.parametrize("kernel_name", ["sdpa", "native"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_step", [False, True])
def test_decode_attention_equals_gqa_sdpa(
    kernel_name: str,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    in_step: bool,
    native: NativeDecode,
) -> None:
    kernel: DecodeKernel = native if kernel_name == "native" else sdpa_decode
    n_heads, n_kv_heads, d, block_size = shape
    q, keys, values, reads, (k, v), visible = paged_inputs(
        dtype, n_heads, n_kv_heads, d, block_size, in_step=in_step
    )
    got = kernel(q, keys, values, reads)  # (B, H, 1, D)
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=visible[:, None, None, :], enable_gqa=n_heads != n_kv_heads
    )
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=ATOL[dtype], rtol=0)
    assert kernel.name == ("native paged" if kernel_name == "native" else "sdpa")
    if not in_step:  # the sequence at position 0 returns value 0 of each kv head exactly
        group = n_heads // n_kv_heads
        torch.testing.assert_close(got[1, :, 0], v[1, :, 0].repeat_interleave(group, 0))


def test_the_native_kernel_is_at_least_as_exact_as_sdpa_in_bf16(native: NativeDecode) -> None:
    q, keys, values, reads, (k, v), visible = paged_inputs(
        torch.bfloat16, 9, 3, 64, 16, in_step=False
    )
    exact = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=visible[:, None, None, :], enable_gqa=True
    )
    native_error = (native(q, keys, values, reads).double() - exact).abs().mean()
    sdpa_error = (sdpa_decode(q, keys, values, reads).double() - exact).abs().mean()
    assert native_error <= sdpa_error * 1.05, (native_error, sdpa_error)


def test_a_cache_dtype_the_kernel_does_not_compute_takes_sdpa(native: NativeDecode) -> None:
    q, keys, values, reads, _, _ = paged_inputs(torch.float16, 4, 2, 16, 16, in_step=False)
    torch.testing.assert_close(native(q, keys, values, reads), sdpa_decode(q, keys, values, reads))


def test_a_failed_build_serves_on_sdpa_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compiler() -> Any:
        raise RuntimeError("no working C++ compiler 'g++'")

    monkeypatch.setattr(decode_attention, "build", no_compiler)
    kernel = NativeDecode()
    kernel.warm_up(heads=4, kv_heads=2, head_dim=16, dtype=torch.float32)
    q, keys, values, reads, _, _ = paged_inputs(torch.float32, 4, 2, 16, 16, in_step=False)
    torch.testing.assert_close(kernel(q, keys, values, reads), sdpa_decode(q, keys, values, reads))
    assert kernel.name == "sdpa (native build failed)"


def test_the_engine_takes_the_native_kernel_only_where_asked_and_only_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert choose_decode_attention(cpu, compile_attention=False) is sdpa_decode
    chosen = choose_decode_attention(cpu, compile_attention=True)
    assert isinstance(chosen, NativeDecode) if native_decode_pays() else chosen is sdpa_decode
    assert choose_decode_attention(torch.device("cuda"), compile_attention=True) is sdpa_decode


async def test_native_decode_attention_serves_the_reference_tokens_and_says_so(
    tiny: Any,
) -> None:
    """`compile_attention`: the same greedy tokens and logprobs as the cache-free model,
    over a batch whose sequences sit at different positions and one decoding in step."""
    params = SamplingParams(max_tokens=12, temperature=0.0)
    model = tiny.model(0)
    async with tiny.serving(compile_attention=True) as engine:
        assert engine.status().kernels.endswith(f"; decode attention {ENGINE_KERNEL}")
        results = await asyncio.gather(*(tiny.collect(engine, p, params) for p in PROMPTS))
        in_step = await tiny.collect(engine, PROMPTS[1], SamplingParams(12, temperature=0.0, n=3))
        assert engine.status().kernels.endswith(f"; decode attention {ENGINE_KERNEL}")  # kept
    for prompt, (completion,) in zip(PROMPTS, results, strict=True):
        assert completion.token_ids == tiny.reference_greedy(model, prompt, 12)
        expected = tiny.reference_logprobs(model, prompt, completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)
    assert all(c.token_ids == results[1][0].token_ids for c in in_step)
