"""Dropping samples whose advantage is zero before the forward, where that changes no update.

A policy-gradient term is ratio·A per token: a sample with A = 0 on every loss token (a
GRPO group whose rewards are all equal) adds exactly zero loss and zero gradient, unless a
term without the advantage is on (KL to the reference, an entropy bonus, a MoE router's
load-balancing loss, which sees every routed token). Where none is, `trained_batches`
removes such samples (and the shared prompts no kept sample continues) from the packed
micro-batches, then joins what is left into as few micro-batches as fit the step's
largest one, so memory never exceeds what the sender packed for. The step's loss
denominators (`step_counts`) are taken before, from every sample, so each kept token's
weight is unchanged and the update is the unskipped one up to float summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tidal.batch.tensors import MicroBatchData, segment_ids
from tidal.models.families import MOE_FAMILIES
from tidal.trainer.config import TrainerConfig
from tidal.trainer.service_trainer import LossKind


@dataclass(frozen=True)
class Skipped:
    """What `trained_batches` left out of this process's micro-batches."""

    samples: int  # samples with loss tokens, all of advantage 0
    tokens: int  # their tokens and those of the prompts no kept sample continues


def skip_is_exact(config: TrainerConfig, kind: LossKind, *, cp: int) -> bool:
    """Whether dropping zero-advantage samples leaves this step's update unchanged (and
    `trainer.loss.skip_zero_advantage` asks for it). Context parallelism splits each row
    over ranks by its layout, so it keeps every sample."""
    loss = config.loss
    return (
        loss.skip_zero_advantage
        and kind == "pg"
        and loss.kl.coef == 0
        and loss.entropy_coef == 0
        and config.model.family not in MOE_FAMILIES
        and cp == 1
    )


def trained_samples(batch: MicroBatchData) -> torch.Tensor:
    """(S,) bool: the samples that carry gradient, and the shared prompts they continue."""
    segments = segment_ids(batch.sample_lengths)  # (T,)
    num = int(batch.sample_lengths.shape[0])
    signal = (batch.loss_mask * (batch.advantages != 0)).cpu()  # (T,) 1 where ℓ_t can be ≠ 0
    keep = torch.zeros(num).index_add_(0, segments.cpu(), signal) > 0  # (S,)
    parents = batch.sample_parents
    if parents is not None:
        kept_children = keep & (parents >= 0)  # (S,)
        keep[parents[kept_children]] = True
    return keep


def select_samples(batch: MicroBatchData, keep: torch.Tensor) -> MicroBatchData:
    """The micro-batch with only the samples where `keep` (S,) is True, parents re-indexed.
    Positions are unchanged: a kept child's parent is kept with it."""
    tokens = keep[segment_ids(batch.sample_lengths)]  # (T,)
    parents = batch.sample_parents
    if parents is not None:
        new_index = torch.cumsum(keep.long(), 0) - 1  # (S,) index among the kept samples
        parents = torch.where(parents >= 0, new_index[parents.clamp(min=0)], -1)[keep]
    versions = batch.policy_versions
    return MicroBatchData(
        input_ids=batch.input_ids[tokens],
        position_ids=batch.position_ids[tokens],
        sample_lengths=batch.sample_lengths[keep],
        loss_mask=batch.loss_mask[tokens],
        advantages=batch.advantages[tokens],
        behaviour_logprobs=batch.behaviour_logprobs[tokens],
        policy_versions=None if versions is None else versions[tokens],
        sample_parents=parents,
        rank=batch.rank,
    )


def concatenate(batches: list[MicroBatchData]) -> MicroBatchData:
    """One micro-batch holding `batches`' samples in order (same rank), parents shifted."""
    if len(batches) == 1:
        return batches[0]
    offsets = torch.cumsum(torch.tensor([0] + [int(b.sample_lengths.shape[0]) for b in batches]), 0)
    any_parents = any(b.sample_parents is not None for b in batches)
    any_versions = any(b.policy_versions is not None for b in batches)

    def parents(b: MicroBatchData, offset: torch.Tensor) -> torch.Tensor:
        if b.sample_parents is None:
            return torch.full_like(b.sample_lengths, -1)
        return torch.where(b.sample_parents >= 0, b.sample_parents + offset, -1)

    def versions(b: MicroBatchData) -> torch.Tensor:
        return torch.full_like(b.input_ids, -1) if b.policy_versions is None else b.policy_versions

    def cat(name: str) -> torch.Tensor:
        return torch.cat([getattr(b, name) for b in batches])

    return MicroBatchData(
        input_ids=cat("input_ids"),
        position_ids=cat("position_ids"),
        sample_lengths=cat("sample_lengths"),
        loss_mask=cat("loss_mask"),
        advantages=cat("advantages"),
        behaviour_logprobs=cat("behaviour_logprobs"),
        policy_versions=torch.cat([versions(b) for b in batches]) if any_versions else None,
        sample_parents=(
            torch.cat([parents(b, offsets[i]) for i, b in enumerate(batches)])
            if any_parents
            else None
        ),
        rank=batches[0].rank,
    )


def trained_batches(
    batches: list[MicroBatchData], *, keep_micro_batches: bool
) -> tuple[list[MicroBatchData], Skipped]:
    """The micro-batches without their zero-advantage samples, and what was left out.

    `keep_micro_batches` (ranks that must run every micro-batch to keep their collectives
    in step): one micro-batch out per one in, a micro-batch with nothing to train kept
    whole. Otherwise empty micro-batches go and the rest are joined, in order, while a
    join stays within the largest micro-batch received."""
    budget = max((b.num_tokens for b in batches), default=0)
    kept: list[MicroBatchData] = []
    samples = tokens = 0
    for batch in batches:
        keep = trained_samples(batch)  # (S,)
        if bool(keep.all()):
            kept.append(batch)
            continue
        if not bool(keep.any()) and keep_micro_batches:
            kept.append(batch)
            continue
        segments = segment_ids(batch.sample_lengths)  # (T,)
        with_loss = torch.zeros(keep.shape[0]).index_add_(0, segments, batch.loss_mask.cpu()) > 0
        samples += int((with_loss & ~keep).sum())
        tokens += int(batch.sample_lengths[~keep].sum())
        if bool(keep.any()):
            kept.append(select_samples(batch, keep))
    if keep_micro_batches:
        return kept, Skipped(samples, tokens)
    joined: list[list[MicroBatchData]] = []
    for batch in kept:
        group = joined[-1] if joined else []
        if (
            group
            and group[0].rank == batch.rank
            and (sum(b.num_tokens for b in group) + batch.num_tokens <= budget)
        ):
            joined[-1].append(batch)
        else:
            joined.append([batch])
    return [concatenate(group) for group in joined], Skipped(samples, tokens)
