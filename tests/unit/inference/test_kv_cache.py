"""The KV cache's storage and attention backends: zeros paid for as they are touched, and
what plain attention computes.

- Storage: `lazy_zeros` are torch's zeros in every cache dtype, writable, page-aligned.
- Decode: each sequence reads its own positions, with both decode kernels.
- Extend: prompts packed into one row equal each prompt run alone, and land in their blocks;
  a prompt computed on top of its cached prefix equals it computed whole.
"""

from __future__ import annotations

import pytest
import torch

from tidal.inference.decode_attention import DecodeKernel, NativeDecode, sdpa_decode
from tidal.inference.kv_cache import PagedKVCache, lazy_zeros, rows_of
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lazy_zeros_are_zeros_like_torch_zeros(dtype: torch.dtype) -> None:
    shape = (2, 64, 3, 8)
    lazy = lazy_zeros(shape, dtype=dtype, device="cpu")
    assert lazy.dtype == dtype and lazy.shape == shape and lazy.is_contiguous()
    assert torch.equal(lazy, torch.zeros(shape, dtype=dtype))
    assert lazy.data_ptr() % 4096 == 0  # a fresh mapping: page-aligned
    lazy[1, 63, 2, 7] = 3.0
    assert lazy.sum().item() == 3.0


def test_lazy_zeros_of_an_empty_shape() -> None:
    assert lazy_zeros((0, 4), dtype=torch.float32, device="cpu").shape == (0, 4)


def tiny_model() -> DecoderLM:
    args = DecoderArgs(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16
    )
    torch.manual_seed(0)
    return DecoderLM(args).eval()


def cache_of(model: DecoderLM, num_blocks: int) -> PagedKVCache:
    return PagedKVCache(
        model.args, num_blocks=num_blocks, block_size=BLOCK, dtype=torch.float32, device="cpu"
    )


BLOCK = 4


def test_packed_prefill_equals_each_prompt_alone_and_caches_its_keys() -> None:
    model = tiny_model()
    prompts = [torch.randint(0, 64, (n,)) for n in (5, 1, 9)]
    cache = cache_of(model, 8)
    tables = [[5, 2], [0], [7, 3, 6]]  # out of order: each prompt goes to its own blocks
    with torch.inference_mode():
        packed = model.hidden_states(
            torch.cat(prompts)[None],
            torch.cat([torch.arange(len(p)) for p in prompts])[None],
            attention=cache.extend(tables, [0, 0, 0], [len(p) for p in prompts]),
        )  # (1, 15, dim)
        start = 0
        for prompt, table in zip(prompts, tables, strict=True):
            n = len(prompt)
            alone = cache_of(model, len(table))
            own = list(range(len(table)))
            model.hidden_states(
                prompt[None], torch.arange(n)[None], attention=alone.extend([own], [0], [n])
            )
            want = model.hidden_states(prompt[None], torch.arange(n)[None])  # plain causal
            torch.testing.assert_close(packed[:, start : start + n], want)
            rows = rows_of([table], n, BLOCK, "cpu")[0]  # (n,)
            torch.testing.assert_close(keys_at(cache, rows), keys_at(alone, torch.arange(n)))
            torch.testing.assert_close(cache.v[:, rows], alone.v[:, :n])
            start += n
    unused = rows_of([[1, 4]], 2 * BLOCK, BLOCK, "cpu")[0]
    assert not keys_at(cache, unused).any()  # blocks no prompt holds were never written


def keys_at(cache: PagedKVCache, rows: torch.Tensor) -> torch.Tensor:
    """Keys (L, N, Hkv, D) of every layer at cache rows `rows` (N,)."""
    slots = cache.slots(rows)
    return torch.stack([cache.read_keys(layer, slots) for layer in range(cache.k.shape[0])])


def test_an_extend_over_a_cached_prefix_equals_the_whole_prompt() -> None:
    model = tiny_model()
    prompt = torch.randint(0, 64, (11,))
    cache, table = cache_of(model, 3), [2, 0, 1]
    with torch.inference_mode():
        want = model.hidden_states(prompt[None], torch.arange(11)[None])  # (1, 11, dim)
        model.hidden_states(
            prompt[None, :8], torch.arange(8)[None], attention=cache.extend([table], [0], [8])
        )
        rest = model.hidden_states(
            prompt[None, 8:], torch.arange(8, 11)[None], attention=cache.extend([table], [8], [3])
        )
    torch.testing.assert_close(rest, want[:, 8:])


@pytest.mark.parametrize("kernel", [sdpa_decode, NativeDecode()], ids=["sdpa", "native"])
@pytest.mark.parametrize("positions", [[6, 6, 6], [6, 2, 9]])
def test_decode_reads_each_sequence_up_to_its_position(
    positions: list[int], kernel: DecodeKernel
) -> None:
    model = tiny_model()
    prompts = [torch.randint(0, 64, (p,)) for p in positions]
    tables = [[5, 2, 8], [0, 7, 9], [4, 3, 1]]
    cache = PagedKVCache(
        model.args,
        num_blocks=10,
        block_size=BLOCK,
        dtype=torch.float32,
        device="cpu",
        decode_kernel=kernel,
    )
    step = torch.randint(0, 64, (3, 1))  # (B, 1) the token each decodes next
    with torch.inference_mode():
        for prompt, table in zip(prompts, tables, strict=True):
            n = len(prompt)
            model.hidden_states(
                prompt[None], torch.arange(n)[None], attention=cache.extend([table], [0], [n])
            )
        decode = cache.decode(tables, positions)
        # Equal positions read no mask: every key read is each sequence's own.
        assert (decode.reads.additive_mask(torch.float32) is None) == (len(set(positions)) == 1)
        got = model.hidden_states(step, decode.reads.positions[:, None], attention=decode)
        for i, prompt in enumerate(prompts):
            ids = torch.cat([prompt, step[i]])[None]
            want = model.hidden_states(ids, torch.arange(ids.shape[1])[None])[:, -1]
            torch.testing.assert_close(got[i], want)
