"""Decode attention with the GQA group folded into the query axis equals plain GQA SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tidal.inference.kv_cache import grouped_decode_attention


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(8, 4), (6, 2), (4, 4)])
def test_grouped_decode_attention_equals_gqa_sdpa_with_a_bool_mask(
    dtype: torch.dtype, atol: float, n_heads: int, n_kv_heads: int
) -> None:
    torch.manual_seed(0)
    b, s, d = 5, 23, 16
    q = torch.randn(b, n_heads, 1, d, dtype=dtype)
    cache_k = torch.randn(b, n_kv_heads, 40, d, dtype=dtype)  # read through a view, as decode does
    cache_v = torch.randn(b, n_kv_heads, 40, d, dtype=dtype)
    k, v = cache_k[:, :, :s], cache_v[:, :, :s]
    positions = torch.tensor([22, 0, 7, 15, 22])  # (B,): each row sees keys [0, position]
    visible = torch.arange(s)[None, :] <= positions[:, None]  # (B, S)
    additive = torch.zeros(b, s, dtype=dtype).masked_fill(~visible, float("-inf"))

    got = grouped_decode_attention(q, k, v, additive[:, None, None, :])  # (B, H, 1, D)
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=visible[:, None, None, :], enable_gqa=n_heads != n_kv_heads
    )
    assert got.shape == (b, n_heads, 1, d)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=0)
    # The row that sees only key 0 returns value 0 of its kv head exactly (no mask leak).
    group = n_heads // n_kv_heads
    torch.testing.assert_close(got[1, :, 0], v[1, :, 0].repeat_interleave(group, 0))
