"""The KV cache's attention backends compute what plain attention computes.

- Decode: the GQA group folded into the query axis equals SDPA with `enable_gqa`.
- Prefill: prompts packed into one row equal each prompt run alone, and land in the cache.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tidal.inference.kv_cache import SlotKVCache, grouped_decode_attention
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM


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


def test_packed_prefill_equals_each_prompt_alone_and_caches_its_keys() -> None:
    args = DecoderArgs(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16
    )
    torch.manual_seed(0)
    model = DecoderLM(args).eval()
    prompts = [torch.randint(0, 64, (n,)) for n in (5, 1, 9)]
    cache = SlotKVCache(args, slots=4, dtype=torch.float32, device="cpu")
    slots = [2, 0, 3]  # out of order: each prompt goes to its own slot
    with torch.inference_mode():
        packed = model.hidden_states(
            torch.cat(prompts)[None],
            torch.cat([torch.arange(len(p)) for p in prompts])[None],
            attention=cache.prefill(slots, [len(p) for p in prompts]),
        )  # (1, 15, dim)
        start = 0
        for prompt, slot in zip(prompts, slots, strict=True):
            n = len(prompt)
            alone = SlotKVCache(args, slots=1, dtype=torch.float32, device="cpu")
            model.hidden_states(
                prompt[None], torch.arange(n)[None], attention=alone.prefill([0], [n])
            )
            want = model.hidden_states(prompt[None], torch.arange(n)[None])  # plain causal
            torch.testing.assert_close(packed[:, start : start + n], want)
            torch.testing.assert_close(cache.k[:, slot, :, :n], alone.k[:, 0, :, :n])
            torch.testing.assert_close(cache.v[:, slot, :, :n], alone.v[:, 0, :, :n])
            start += n
    assert not cache.k[:, 1].any()  # the unused slot was never written
