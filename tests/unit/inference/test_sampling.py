"""Sampling: filters keep the right tokens, logprobs describe the sampled distribution."""

from __future__ import annotations

import math

import torch

from tidal.inference.sampling import (
    CDF_CHUNK,
    draw_uniforms,
    greedy_tokens,
    row_seed,
    sample_tokens,
)

from ...helpers.sampled_distribution import filtered_logprobs


def params(b: int, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):  # type: ignore[no-untyped-def]
    return (
        torch.full((b,), temperature),
        torch.full((b,), top_k, dtype=torch.long),
        torch.full((b,), top_p),
    )


def kept(logprobs: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logprobs)).flatten().tolist())


def test_greedy_picks_argmax_with_unscaled_logprob() -> None:
    logits = torch.randn(4, 50)
    logprobs = filtered_logprobs(logits, *params(4, temperature=0.0, top_k=3, top_p=0.5))
    tokens, chosen = sample_tokens(
        logprobs, torch.ones(4, dtype=torch.bool), torch.rand(4).double()
    )
    assert torch.equal(tokens, logits.argmax(-1))
    torch.testing.assert_close(chosen, logprobs.gather(-1, tokens[:, None])[:, 0])
    # greedy ignores the filters: the reported logprob is the model's own
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1))


def test_top_k_keeps_the_k_most_likely() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5, 2.5]])
    assert kept(filtered_logprobs(logits, *params(1, top_k=3))[0]) == {1, 3, 5}
    assert kept(filtered_logprobs(logits, *params(1, top_k=1))[0]) == {1}


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log()
    assert kept(filtered_logprobs(logits, *params(1, top_p=0.7))[0]) == {1, 3}
    assert kept(filtered_logprobs(logits, *params(1, top_p=0.85))[0]) == {1, 2, 3}
    assert kept(filtered_logprobs(logits, *params(1, top_p=0.4))[0]) == {1}  # best always kept
    assert kept(filtered_logprobs(logits, *params(1, top_p=1.0))[0]) == {0, 1, 2, 3}


def test_top_p_applies_to_the_distribution_renormalized_after_top_k() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    # after top-k=2: 0.4/0.7 = 0.571, 0.3/0.7: p=0.5 keeps only the first
    assert kept(filtered_logprobs(probs.log(), *params(1, top_k=2, top_p=0.5))[0]) == {0}


def test_logprobs_are_log_softmax_of_filtered_scaled_logits() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 20)
    temperature, k, p = 0.7, 8, 0.6
    out = filtered_logprobs(logits, *params(1, temperature=temperature, top_k=k, top_p=p))[0]
    scaled = logits[0] / temperature
    order = scaled.argsort(descending=True)[:k]
    probs = torch.softmax(scaled[order], -1)
    mass_before = probs.cumsum(0) - probs
    keep = order[mass_before < p]
    expected = torch.full_like(scaled, -math.inf)
    expected[keep] = torch.log_softmax(scaled[keep], -1)
    torch.testing.assert_close(out, expected)
    assert math.isclose(out.exp().sum().item(), 1.0, rel_tol=1e-6)


def test_rows_use_their_own_parameters() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).repeat(3, 1)
    temperature = torch.tensor([1.0, 0.5, 0.0])
    top_k = torch.tensor([2, 0, 1])
    out = filtered_logprobs(logits, temperature, top_k, torch.ones(3))
    assert kept(out[0]) == {2, 3}
    torch.testing.assert_close(out[1], torch.log_softmax(logits[1] / 0.5, -1))
    torch.testing.assert_close(out[2], torch.log_softmax(logits[2], -1))  # greedy: unfiltered


def test_draws_never_pick_filtered_tokens_and_follow_the_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, -5.0]])
    logprobs = filtered_logprobs(logits, *params(1, top_k=3))
    u = draw_uniforms(7, 20_000)
    tokens, _ = sample_tokens(logprobs.expand(len(u), -1), torch.zeros(len(u), dtype=torch.bool), u)
    counts = torch.bincount(tokens, minlength=5).double() / len(u)
    assert counts[0] == 0 and counts[4] == 0
    torch.testing.assert_close(counts, logprobs[0].exp().double(), atol=0.015, rtol=0)
    # extreme uniforms stay inside the kept set
    edge, _ = sample_tokens(
        logprobs.expand(2, -1),
        torch.zeros(2, dtype=torch.bool),
        torch.tensor([0.0, 1.0 - 1e-16], dtype=torch.float64),
    )
    assert edge.tolist() == [1, 3]  # first and last kept token in vocabulary order


def test_same_seed_same_uniforms_and_indices_differ() -> None:
    assert torch.equal(draw_uniforms(row_seed(5, 0), 8), draw_uniforms(row_seed(5, 0), 8))
    assert not torch.equal(draw_uniforms(row_seed(5, 0), 8), draw_uniforms(row_seed(5, 1), 8))


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.12, 0.08]])
    t, k, p = params(1)
    # threshold 0.2 * 0.5 = 0.1: the 0.08 token goes, the rest renormalize
    out = filtered_logprobs(probs.log(), t, k, p, torch.tensor([0.2]))[0]
    assert kept(out) == {0, 1, 2}
    torch.testing.assert_close(out[:3].exp(), probs[0, :3] / probs[0, :3].sum())
    # min-p on the temperature-scaled distribution: at T=0.5 probs square, 0.12 falls too
    sharp = filtered_logprobs(probs.log(), torch.tensor([0.5]), k, p, torch.tensor([0.2]))[0]
    assert kept(sharp) == {0, 1}
    assert kept(filtered_logprobs(probs.log(), t, k, p, torch.tensor([0.0]))[0]) == {0, 1, 2, 3}


def test_greedy_fast_path_equals_filtered_argmax() -> None:
    logits = torch.randn(6, 50) * 4  # (B, V)
    tokens, logprobs = greedy_tokens(logits)
    full = filtered_logprobs(logits, *params(6, temperature=0.0))
    expected, chosen = sample_tokens(full, torch.ones(6, dtype=torch.bool), torch.rand(6).double())
    assert tokens.tolist() == expected.tolist()
    torch.testing.assert_close(logprobs, chosen)


def full_cdf_draw(logprobs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The one-level inverse CDF: a float64 running sum over the whole vocabulary."""
    cdf = logprobs.exp().double().cumsum(dim=-1)  # (B, V)
    total = cdf[:, -1:].contiguous()
    drawn = torch.searchsorted(cdf, uniforms[:, None] * total, right=True)
    return torch.minimum(drawn, torch.searchsorted(cdf, total)).squeeze(-1)


def test_chunked_draws_equal_the_full_cdf_at_the_same_uniforms() -> None:
    generator = torch.Generator().manual_seed(3)
    vocab = 3 * CDF_CHUNK + 77  # a partial last chunk
    logits = torch.randn(64, vocab, generator=generator) * 3  # (B, V)
    # Filtered tokens, whole empty chunks and a lone token at the very end.
    logits[:16, : 2 * CDF_CHUNK] = float("-inf")
    logits[16:32, :-1] = float("-inf")
    logits[32:48] = logits[32:48].masked_fill(logits[32:48] < 2.0, float("-inf"))
    logprobs = torch.log_softmax(logits, dim=-1).repeat(40, 1)  # (40 * B, V)
    u = draw_uniforms(11, logprobs.shape[0])
    u[:64], u[64:128] = 0.0, 1.0 - 2**-53  # the CDF's two ends
    tokens, chosen = sample_tokens(logprobs, None, u)
    assert tokens.tolist() == full_cdf_draw(logprobs, u).tolist()
    assert bool(torch.isfinite(logprobs.gather(-1, tokens[:, None])).all())  # never filtered
    torch.testing.assert_close(chosen, logprobs.gather(-1, tokens[:, None])[:, 0])
    # Raw (unnormalized) log-weights give the same draws as their log-softmax.
    raw, _ = sample_tokens(logits.repeat(40, 1), None, u)
    assert (raw == tokens).float().mean() > 0.999


def test_draws_follow_a_large_vocabulary_distribution() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 2 * CDF_CHUNK + 3, generator=generator) * 2  # (1, V)
    u = draw_uniforms(13, 30_000)
    tokens, _ = sample_tokens(logits.expand(len(u), -1), None, u)
    probs = torch.softmax(logits[0].double(), -1)
    # Bucket tokens by probability decile so every bucket expects thousands of draws.
    order = probs.argsort()
    bucket = torch.empty_like(order)
    bucket[order] = torch.arange(len(order)) * 10 // len(order)
    observed = torch.bincount(bucket[tokens], minlength=10).double() / len(u)
    expected = torch.zeros(10, dtype=torch.float64).index_add_(0, bucket, probs)
    torch.testing.assert_close(observed, expected, atol=0.012, rtol=0)  # 4 sigma at p = 0.5
