"""Truncation of trained samples: caps on prompt, completion and total length per sample.

Applied to each packed micro-batch before the step's token counts, so normalization sees
exactly the trained tokens. A prompt keeps its last tokens, a completion its first; over
the total cap the completion's tail goes first. A truncated sample is a new sequence:
positions restart and its first kept token is never a loss token.
"""

from __future__ import annotations

from typing import Any

import torch

from tidal.batch.tensors import MicroBatchData, positions_for


def truncation_enabled(config: Any) -> bool:
    return any(
        v is not None
        for v in (config.max_prompt_tokens, config.max_completion_tokens, config.max_total_tokens)
    )


def _kept_span(prompt: int, completion: int, config: Any) -> tuple[int, int]:
    """(prompt tokens kept, completion tokens kept) for one sample."""
    if config.max_prompt_tokens is not None:
        prompt = min(prompt, config.max_prompt_tokens)
    if config.max_completion_tokens is not None:
        completion = min(completion, config.max_completion_tokens)
    total = config.max_total_tokens
    if total is not None and prompt + completion > total:
        completion = max(0, total - prompt)
        prompt = min(prompt, total)
    return prompt, completion


def truncate_micro_batch(batch: MicroBatchData, config: Any) -> MicroBatchData:
    """`batch` with every sample cut to the caps of `config` (a `TruncationConfig`); the
    same object if none apply."""
    keep = torch.zeros(batch.num_tokens, dtype=torch.bool, device=batch.input_ids.device)  # (T,)
    lengths: list[int] = []
    start = 0
    for length in batch.sample_lengths.tolist():
        mask = batch.loss_mask[start : start + length]
        loss_at = torch.nonzero(mask > 0)
        prompt = int(loss_at[0]) if loss_at.numel() else length
        kept_prompt, kept_completion = _kept_span(prompt, length - prompt, config)
        first = start + prompt - kept_prompt
        keep[first : start + prompt + kept_completion] = True
        if kept_prompt + kept_completion:
            lengths.append(kept_prompt + kept_completion)
        start += length
    if bool(keep.all()):
        return batch
    sample_lengths = torch.tensor(lengths, dtype=torch.int64, device=keep.device)  # (S',)
    loss_mask = batch.loss_mask[keep].clone()  # (T',)
    starts = torch.cumsum(sample_lengths, 0) - sample_lengths  # (S',)
    loss_mask[starts] = 0.0  # a sample's first token has no prediction inside it
    return MicroBatchData(
        input_ids=batch.input_ids[keep],
        position_ids=positions_for(sample_lengths.cpu()).to(keep.device),
        sample_lengths=sample_lengths,
        loss_mask=loss_mask,
        advantages=batch.advantages[keep] * loss_mask,
        behaviour_logprobs=batch.behaviour_logprobs[keep] * loss_mask,
        policy_versions=None if batch.policy_versions is None else batch.policy_versions[keep],
        rank=batch.rank,
    )
