"""Padding-free packing: a `[1, T]` row of concatenated samples (positions restarting per
sample, attention isolated per sample) gives the same per-token logprobs and the same
gradients as running each sample on its own (fp32), for every family."""

from __future__ import annotations

import pytest
import torch

from tidal.models.args import DecoderArgs
from tidal.models.attention import check_packed_kind
from tidal.models.families import family_of
from tidal.models.layers import DecoderLM

LENGTHS = [5, 11, 1, 8]
SHAPE = {"vocab_size": 264, "dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
         "ffn_dim": 48, "max_seq_len": 128}  # fmt: skip
FAMILIES = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {"n_experts": 4, "n_experts_per_tok": 2, "moe_ffn_dim": 16},
    "qwen2_moe": {"n_experts": 4, "n_experts_per_tok": 2, "moe_ffn_dim": 16,
                  "shared_expert_ffn_dim": 24},
}  # fmt: skip


def random_model(family: str) -> DecoderLM:
    record = family_of(family)
    args = DecoderArgs(
        family=family, attention_bias=record.attention_bias, qk_norm=record.qk_norm,
        tie_embeddings=False, **SHAPE, **FAMILIES[family],
    )  # fmt: skip
    model = DecoderLM(args)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1)
        for name, p in model.named_parameters():  # biases and norms random too
            if p.dim() == 1 and not name.endswith("bias"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    assert isinstance(model, DecoderLM)
    return model


def samples(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, vocab, (n,), generator=g) for n in LENGTHS]


def next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits (L, V), ids (L,) → (L-1,) log p(ids[t+1] | ids[:t+1])."""
    return torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None]).squeeze(-1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_equals_unpacked_logprobs_and_gradients(family: str) -> None:
    model = random_model(family)
    seqs = samples(model.args.vocab_size)
    # Per-token weights (advantage-like) over the token count: the trainer's token-mean loss.
    g = torch.Generator().manual_seed(3)
    n_scored = sum(n - 1 for n in LENGTHS)
    weights = [torch.randn(len(s) - 1, generator=g) / n_scored for s in seqs]

    separate = []
    for ids, w in zip(seqs, weights, strict=True):
        logits = model(ids[None], torch.arange(len(ids))[None])[0]  # (L, V)
        lp = next_token_logprobs(logits, ids)
        (lp * w).sum().backward()  # gradients accumulate over the samples
        separate.append(lp.detach())
    grads_separate = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    ids = torch.cat(seqs)[None]  # (1, T)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]  # (1, T)
    logits = model(ids, positions, sample_lengths=torch.tensor(LENGTHS))[0]  # (T, V)
    packed, loss, start = [], torch.zeros(()), 0
    for n, w in zip(LENGTHS, weights, strict=True):
        lp = next_token_logprobs(logits[start : start + n], ids[0, start : start + n])
        loss = loss + (lp * w).sum()
        packed.append(lp.detach())
        start += n
    loss.backward()

    torch.testing.assert_close(torch.cat(packed), torch.cat(separate), rtol=0, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.grad, grads_separate[name], rtol=0, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_packed_samples_do_not_see_each_other() -> None:
    model = random_model("llama")
    a, b = samples(model.args.vocab_size)[:2]
    other = (b + 1) % model.args.vocab_size
    pos = torch.cat([torch.arange(len(a)), torch.arange(len(b))])[None]
    lengths = torch.tensor([len(a), len(b)])
    with torch.no_grad():
        first = model(torch.cat([a, b])[None], pos, sample_lengths=lengths)[0, : len(a)]
        changed = model(torch.cat([a, other])[None], pos, sample_lengths=lengths)[0, : len(a)]
    torch.testing.assert_close(first, changed, rtol=0, atol=0)


def test_flash_attention_off_cuda_is_refused() -> None:
    with pytest.raises(ValueError, match="flash_attention_2"):
        check_packed_kind("flash_attention_2", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_varlen_equals_sdpa_block_diagonal_on_gpu() -> None:
    pytest.importorskip("flash_attn")
    from tidal.models.attention import FlashVarlenAttention, PackedCausalAttention

    lengths = torch.tensor(LENGTHS, device="cuda")
    total = int(lengths.sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 8, total, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 2, total, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 2, total, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    flash = FlashVarlenAttention(lengths, total)(0, q, k, v)
    reference = PackedCausalAttention(lengths, total)(0, q, k, v)
    torch.testing.assert_close(flash.float(), reference.float(), rtol=0, atol=2e-2)


def test_per_segment_attention_equals_the_block_diagonal_mask() -> None:
    from tidal.models.attention import PackedCausalAttention, sdpa

    g = torch.Generator().manual_seed(4)
    total = sum(LENGTHS)
    q = torch.randn(1, 4, total, 8, generator=g)  # (1, H, T, D)
    k, v = torch.randn(2, 1, 2, total, 8, generator=g)  # (1, Hkv, T, D) each
    backend = PackedCausalAttention(torch.tensor(LENGTHS), total)
    masked = sdpa(q, k, v, mask=backend.mask, causal=False)
    torch.testing.assert_close(backend(0, q, k, v), masked, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "lengths",
    [LENGTHS, [7] * 9, [40, 1, 3, 3, 7, 2, 12, 1, 9]],  # one bucket; equal; several buckets
)
def test_padded_buckets_equal_the_per_sample_loop_values_and_gradients(
    lengths: list[int],
) -> None:
    """The batched (padded, bucketed) backend is the per-sample loop, values and gradients,
    with grouped-query heads (4 query heads over 2 key/value heads)."""
    from tidal.models.attention import PackedCausalAttention, PaddedCausalAttention

    g = torch.Generator().manual_seed(5)
    total = sum(lengths)
    # Token-major like the model's projections: (1, T, H, D) transposed to (1, H, T, D).
    q0 = torch.randn(1, total, 4, 8, generator=g).transpose(1, 2)
    k0, v0 = (torch.randn(1, total, 2, 8, generator=g).transpose(1, 2) for _ in range(2))
    upstream = torch.randn(1, 4, total, 8, generator=g)
    results = []
    for backend in (PackedCausalAttention, PaddedCausalAttention):
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q0, k0, v0))
        out = backend(torch.tensor(lengths), total)(0, q, k, v)  # (1, H, T, D)
        (out * upstream).sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad))
    for loop, padded in zip(*results, strict=True):
        torch.testing.assert_close(padded, loop, rtol=0, atol=1e-6)


def test_length_buckets_bound_the_padding() -> None:
    from tidal.models.attention import length_buckets

    lengths = [40, 1, 3, 3, 7, 2, 12, 1, 9]
    buckets = length_buckets(lengths, pad_factor=2.0)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for bucket in buckets:
        longest = max(lengths[i] for i in bucket)
        assert lengths[bucket[0]] == longest
        assert len(bucket) == 1 or len(bucket) * longest <= 2.0 * sum(lengths[i] for i in bucket)
    assert len(length_buckets([7] * 9)) == 1  # equal lengths: one call
