"""Sampling: per-row temperature, min-p, top-k, top-p and seeded draws, vectorised.

Filters apply in that order, top-p on the distribution renormalized after the earlier
ones. A token's logprob is under exactly the distribution it was drawn from (the model's
own for a greedy row); the unmodified model logprob can be returned beside it. Each row's
uniforms for the whole completion come from a generator seeded by (request seed, sample
index) and a token is the inverse CDF at the step's uniform, so a row's tokens depend on
its seed and logits only, never on the batch. The CDF is searched in two levels (chunk
totals, then one chunk) in float64, so a step reads the vocabulary twice (one softmax,
one pass of chunk sums) and runs no float64 running sum over all of it. All-greedy steps
skip the draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, index) over 63 bits
CDF_CHUNK = 256
"""Tokens per chunk of the two-level CDF search: the chunk totals and the one chunk
searched are each a few hundred float64 values at a 50K-token vocabulary."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one prompt's completions (already validated)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends at the token that completes one (the token is kept)."""
    model_logprobs: bool = False
    """Also return each token's logprob under the unmodified model distribution."""
    prompt_logprobs: int | None = None
    """Also score the prompt's own tokens (vLLM's `prompt_logprobs`): None off, else how
    many most likely alternatives to return at each position."""
    prompt_logprobs_start: int = 1
    """First prompt position scored; positions before it may come from the prefix cache."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def row_seed(seed: int, index: int) -> int:
    """The generator seed of sample `index` of a request seeded with `seed`."""
    return (seed * _SEED_MIX + index) % (1 << 63)


def draw_uniforms(seed: int, count: int) -> torch.Tensor:
    """`count` uniforms in [0, 1) (float64) from a generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(count, generator=generator, dtype=torch.float64)


def filtered_logits(
    logits: torch.Tensor,  # (B, V) fp32
    temperature: torch.Tensor | None,  # (B,) fp32; 0 = greedy; None = 1 for every row
    top_k: torch.Tensor | None,  # (B,) long; <= 0 = off; None = off for every row
    top_p: torch.Tensor | None,  # (B,) fp32; <= 0 or >= 1 = off; None = off for every row
    min_p: torch.Tensor | None = None,  # (B,) fp32; <= 0 = off; None = off for every row
) -> torch.Tensor:
    """Unnormalized log-weights `(B, V)` of the distribution each row samples from: the
    temperature-scaled logits, -inf where filtered; a greedy row's raw logits. `logits`
    itself when no row scales or filters.

    None for a parameter no row uses skips its checks: the result is the same either way.
    """
    vocab = logits.shape[-1]
    greedy: torch.Tensor | None = None
    scaled = logits  # (B, V)
    if temperature is not None:
        greedy = temperature <= 0
        if bool(greedy.all()):
            return logits
        scale = torch.where(greedy, torch.ones_like(temperature), temperature)
        scaled = logits / scale[:, None] if bool((scale != 1).any()) else logits
    if min_p is not None:
        active = min_p > 0 if greedy is None else (min_p > 0) & ~greedy  # (B,)
        if bool(active.any()):
            # p >= min_p * p_max  <=>  logit >= max logit + log(min_p), on the scaled logits
            floor = scaled.max(dim=-1).values + torch.log(min_p.clamp(min=1e-30))  # (B,)
            scaled = scaled.masked_fill((scaled < floor[:, None]) & active[:, None], float("-inf"))
    if top_k is None and top_p is None:
        return scaled
    rows = logits.shape[0]
    if greedy is None:
        greedy = torch.zeros(rows, dtype=torch.bool, device=logits.device)
    if top_k is None:
        top_k = torch.zeros(rows, dtype=torch.long, device=logits.device)
    if top_p is None:
        top_p = torch.ones(rows, device=logits.device)
    k = torch.where(greedy | (top_k <= 0) | (top_k >= vocab), vocab, top_k)  # (B,)
    p_off = greedy | (top_p <= 0) | (top_p >= 1)
    if bool((k >= vocab).all()) and bool(p_off.all()):
        return scaled
    sorted_logits, order = scaled.sort(dim=-1, descending=True)  # (B, V) each
    ranks = torch.arange(vocab, device=logits.device)
    keep_sorted = ranks[None, :] < k[:, None]  # (B, V) top-k
    probs_sorted = torch.softmax(sorted_logits.masked_fill(~keep_sorted, float("-inf")), dim=-1)
    mass_before = probs_sorted.cumsum(dim=-1) - probs_sorted  # (B, V) mass of better tokens
    keep_sorted &= (mass_before < top_p[:, None]) | p_off[:, None]
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # back to vocab order
    return scaled.masked_fill(~keep, float("-inf"))


def sample_tokens(
    weights: torch.Tensor,  # (B, V) fp32 log-weights, from filtered_logits
    greedy: torch.Tensor | None,  # (B,) bool; None = no greedy row
    uniforms: torch.Tensor,  # (B,) float64 in [0, 1)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens `(B,)` and their logprobs `(B,)` under each row's normalized `weights`:
    argmax for greedy rows, the inverse CDF at `uniforms` otherwise."""
    probs = torch.softmax(weights, dim=-1)  # (B, V) fp32
    if greedy is not None and bool(greedy.all()):
        tokens = weights.argmax(dim=-1)
    else:
        tokens = inverse_cdf(probs, uniforms.to(probs.device))
        if greedy is not None and bool(greedy.any()):
            tokens = torch.where(greedy, weights.argmax(dim=-1), tokens)
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row of `probs` (B, V), the first token whose float64 CDF exceeds `uniforms` (B,)
    times the row's total: the chunk holding that point, then the token inside it.

    Only tokens with mass are ever returned: the chunk's and the token's running sums
    both step past the target there. The float64 sums keep a tail of tiny probabilities
    from being rounded away; chunking spares the full-vocabulary running sum.
    """
    rows, vocab = probs.shape
    n_chunks = -(-vocab // CDF_CHUNK)
    if vocab % CDF_CHUNK:
        probs = F.pad(probs, (0, n_chunks * CDF_CHUNK - vocab))  # zero mass: never drawn
    chunks = probs.view(rows, n_chunks, CDF_CHUNK)  # (B, C, K)
    sums = chunks.sum(dim=-1, dtype=torch.float64)  # (B, C)
    cdf = sums.cumsum(dim=-1)  # (B, C)
    total = cdf[:, -1:].contiguous()  # (B, 1)
    target = uniforms[:, None] * total  # (B, 1)
    # side="right": the first chunk whose CDF exceeds the target; capped at the last chunk
    # with mass, for a target rounded up to the total.
    chunk = torch.searchsorted(cdf, target, right=True)  # (B, 1)
    chunk = torch.minimum(chunk, torch.searchsorted(cdf, total, right=False))
    before = F.pad(cdf, (1, 0)).gather(-1, chunk)  # (B, 1) mass of the earlier chunks
    picked = chunks.gather(1, chunk[:, :, None].expand(-1, -1, CDF_CHUNK))[:, 0]  # (B, K)
    inner = picked.double().cumsum(dim=-1)  # (B, K)
    rest = target - before  # (B, 1) >= 0: before is the CDF just below the target
    token = torch.searchsorted(inner, rest, right=True)
    # The same cap inside the chunk: its last token with mass.
    token = torch.minimum(token, torch.searchsorted(inner, inner[:, -1:].contiguous()))
    return (chunk * CDF_CHUNK + token).squeeze(-1)  # (B,)


def greedy_tokens(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax tokens `(B,)` and their model logprobs `(B,)` of fp32 `logits` (B, V).

    The same tokens and logprobs as `filtered_logits` + `sample_tokens` give greedy rows.
    """
    logprobs = torch.log_softmax(logits, dim=-1)  # (B, V)
    tokens = logprobs.argmax(dim=-1)  # (B,)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
