"""Both decode-attention kernels compute GQA attention of one query token per sequence.

Each is checked against torch's own GQA SDPA with a bool mask, with and without the
additive mask, in fp32 and bf16; the compiled one also against SDPA in float64, where it
must be at least as close as SDPA's own bf16 kernel. A compile that fails leaves the
engine serving on SDPA, named so in its status; an engine asked to compile serves the
cache-free model's tokens and logprobs on the compiled kernel.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tidal.inference.decode_attention import (
    DecodeKernel,
    InductorDecode,
    choose_decode_attention,
    sdpa_decode,
)
from tidal.inference.sampling import SamplingParams

from .test_engine import PROMPTS

ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.fixture(scope="module")
def inductor() -> InductorDecode:
    """One compiled kernel for the module: its compile is the slow part."""
    return InductorDecode()


def decode_inputs(
    dtype: torch.dtype, n_heads: int, n_kv_heads: int, *, masked: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """q (B, H, 1, D), k and v (B, Hkv, S, D) as views of a longer cache, the additive
    mask (B, 1, 1, S) or None, and the bool mask (B, S) it stands for."""
    torch.manual_seed(0)
    b, s, d = 5, 23, 16
    q = torch.randn(b, n_heads, 1, d, dtype=dtype)
    cache_k = torch.randn(b, n_kv_heads, 40, d, dtype=dtype)  # read through a view, as decode does
    cache_v = torch.randn(b, n_kv_heads, 40, d, dtype=dtype)
    k, v = cache_k[:, :, :s], cache_v[:, :, :s]
    positions = torch.tensor([22, 0, 7, 15, 22]) if masked else torch.full((b,), s - 1)
    visible = torch.arange(s)[None, :] <= positions[:, None]  # (B, S): keys [0, position]
    additive = torch.zeros(b, s, dtype=dtype).masked_fill(~visible, float("-inf"))
    return q, k, v, additive[:, None, None, :] if masked else None, visible


CASES = [  # (kernel, n_heads, n_kv_heads): every GQA shape on SDPA; one on the compiled
    # kernel, whose compile dominates the time (each group size is a compile of its own)
    *[("sdpa", h, kv) for h, kv in [(8, 4), (6, 2), (4, 4)]],
    ("inductor", 4, 2),  # the engine test's tiny model's shape: its compiled graphs serve both
]


@pytest.mark.parametrize(("kernel_name", "n_heads", "n_kv_heads"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [True, False])
def test_decode_attention_equals_gqa_sdpa(
    kernel_name: str,
    dtype: torch.dtype,
    n_heads: int,
    n_kv_heads: int,
    masked: bool,
    inductor: InductorDecode,
) -> None:
    kernel: DecodeKernel = inductor if kernel_name == "inductor" else sdpa_decode
    q, k, v, mask, visible = decode_inputs(dtype, n_heads, n_kv_heads, masked=masked)

    got = kernel(q, k, v, mask)  # (B, H, 1, D)
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=visible[:, None, None, :], enable_gqa=n_heads != n_kv_heads
    )
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=ATOL[dtype], rtol=0)
    assert kernel.name == kernel_name  # the compiled kernel did not fall back
    if masked:  # the row that sees only key 0 returns value 0 of its kv head exactly
        group = n_heads // n_kv_heads
        torch.testing.assert_close(got[1, :, 0], v[1, :, 0].repeat_interleave(group, 0))


def test_the_compiled_kernel_is_at_least_as_exact_as_sdpa_in_bf16(inductor: InductorDecode) -> None:
    q, k, v, mask, visible = decode_inputs(torch.bfloat16, 4, 2, masked=True)
    exact = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=visible[:, None, None, :], enable_gqa=True
    )
    compiled_error = (inductor(q, k, v, mask).double() - exact).abs().mean()
    sdpa_error = (sdpa_decode(q, k, v, mask).double() - exact).abs().mean()
    assert compiled_error <= sdpa_error * 1.05, (compiled_error, sdpa_error)


def test_a_failed_compile_serves_on_sdpa_and_says_so() -> None:
    def no_compiler(func: Any, **options: Any) -> Any:
        def first_call(*args: Any) -> Any:
            raise RuntimeError("No working C++ compiler found")  # as Inductor's would

        return first_call

    kernel = InductorDecode(compiler=no_compiler)
    q, k, v, mask, _ = decode_inputs(torch.float32, 4, 2, masked=True)
    torch.testing.assert_close(kernel(q, k, v, mask), sdpa_decode(q, k, v, mask))
    assert kernel.name == "sdpa (inductor compile failed)"
    torch.testing.assert_close(kernel(q, k, v, None), sdpa_decode(q, k, v, None))  # for good


def test_the_engine_compiles_only_where_asked_and_only_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert choose_decode_attention(cpu, compile_attention=False) is sdpa_decode
    assert isinstance(choose_decode_attention(cpu, compile_attention=True), InductorDecode)
    assert choose_decode_attention(torch.device("cuda"), compile_attention=True) is sdpa_decode


async def test_compiled_decode_attention_serves_the_reference_tokens_and_says_so(
    tiny: Any,
) -> None:
    """`compile_attention`: the same greedy tokens and logprobs as the cache-free model,
    over a batch whose sequences sit at different positions (the masked variant) and one
    decoding in step (the unmasked one)."""
    params = SamplingParams(max_tokens=12, temperature=0.0)
    model = tiny.model(0)
    async with tiny.serving(compile_attention=True) as engine:
        assert engine.status().kernels.endswith("; decode attention inductor")
        results = await asyncio.gather(*(tiny.collect(engine, p, params) for p in PROMPTS))
        in_step = await tiny.collect(engine, PROMPTS[1], SamplingParams(12, temperature=0.0, n=3))
        assert engine.status().kernels.endswith("; decode attention inductor")  # no fallback
    for prompt, (completion,) in zip(PROMPTS, results, strict=True):
        assert completion.token_ids == tiny.reference_greedy(model, prompt, 12)
        expected = tiny.reference_logprobs(model, prompt, completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)
    assert all(c.token_ids == results[1][0].token_ids for c in in_step)
