"""bf16 attention on CPU under training: `sdpa` computes it in fp32 (torch's bf16 flash
backward on CPU is ~12x slower; tidal.models.attention.sdpa). Parity with the plain bf16
kernel, values and gradients, both for bf16 inputs and for fp32 inputs under autocast,
and no worse than it against an fp64 reference."""

from __future__ import annotations

import pytest
import torch

from tidal.models.attention import _sdpa, sdpa

BF16_ATOL = 2e-2  # a few bf16 ulps at these magnitudes (|out| < 2)


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 12, 16, generator=g)
    k, v = (torch.randn(2, 2, 12, 16, generator=g) for _ in range(2))  # GQA: 4 over 2
    upstream = torch.randn(2, 4, 12, 16, generator=g)
    return (*(t.to(dtype) for t in (q, k, v)), upstream)


def _run(fn, q, k, v, upstream, *, autocast: bool = False):  # type: ignore[no-untyped-def]
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = fn(q, k, v, mask=None, causal=True)
    (out.float() * upstream).sum().backward()
    return out, q.grad, k.grad, v.grad


def test_bf16_inputs_compute_in_fp32_and_match_the_bf16_kernel() -> None:
    q, k, v, upstream = _inputs(torch.bfloat16)
    ours = _run(sdpa, q, k, v, upstream)
    plain = _run(_sdpa, q, k, v, upstream)
    assert ours[0].dtype == torch.bfloat16  # the caller still gets bf16 back
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=BF16_ATOL)
    reference = _run(_sdpa, *(t.double() for t in (q, k, v)), upstream.double())
    for a, b, ref in zip(ours, plain, reference, strict=True):  # no less accurate
        assert (a.double() - ref).abs().max() <= (b.double() - ref).abs().max() + 1e-3


@pytest.mark.parametrize("requires_grad", [True, False])
def test_fp32_inputs_under_autocast_match_autocasts_own_bf16_call(requires_grad: bool) -> None:
    q, k, v, upstream = _inputs(torch.float32)
    if not requires_grad:  # inference: the bf16 kernel itself, untouched
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert sdpa(q, k, v, mask=None, causal=True).dtype == torch.bfloat16
        return
    ours = _run(sdpa, q, k, v, upstream, autocast=True)
    plain = _run(_sdpa, q, k, v, upstream, autocast=True)
    assert ours[0].dtype == plain[0].dtype == torch.bfloat16
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=BF16_ATOL)


def test_fp32_without_autocast_is_the_plain_call_bit_for_bit() -> None:
    q, k, v, upstream = _inputs(torch.float32)
    for a, b in zip(_run(sdpa, q, k, v, upstream), _run(_sdpa, q, k, v, upstream), strict=True):
        assert torch.equal(a, b)
