"""The distribution a sampled row is drawn from, normalized: the sampling tests' reference.

The engine draws from `filtered_logits`' unnormalized log-weights (`sample_tokens`
normalizes them), so the normalized logprobs over the whole vocabulary are a test's
concern: what each reported logprob and each filter is checked against.
"""

from __future__ import annotations

import torch

from tidal.inference.sampling import filtered_logits


def filtered_logprobs(
    logits: torch.Tensor,  # (B, V) fp32
    temperature: torch.Tensor | None,  # (B,) fp32; 0 = greedy; None = 1 for every row
    top_k: torch.Tensor | None,  # (B,) long; <= 0 = off; None = off for every row
    top_p: torch.Tensor | None,  # (B,) fp32; <= 0 or >= 1 = off; None = off for every row
    min_p: torch.Tensor | None = None,  # (B,) fp32; <= 0 = off; None = off for every row
) -> torch.Tensor:
    """Log-probabilities `(B, V)` of the distribution each row samples from (-inf = filtered)."""
    return torch.log_softmax(filtered_logits(logits, temperature, top_k, top_p, min_p), dim=-1)
