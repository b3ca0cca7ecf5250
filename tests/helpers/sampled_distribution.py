"""The distribution a sampled row is drawn from, normalized: the sampling tests' reference.

The engine draws from `filtered_logits`' unnormalized log-weights (`sample_tokens`
normalizes them), so the normalized logprobs over the whole vocabulary are a test's
concern: what each reported logprob and each filter is checked against.
"""

from __future__ import annotations

import torch

from tidal.inference.sampling import filtered_logits


def filtered_logprobs(logits: torch.Tensor, *filters: torch.Tensor | None) -> torch.Tensor:
    """Log-probabilities `(B, V)` of the distribution each row of `logits` `(B, V)` samples
    from (-inf = filtered); `filters` are `filtered_logits`' temperature, top_k, top_p and
    min_p, in its order."""
    return torch.log_softmax(filtered_logits(logits, *filters), dim=-1)
