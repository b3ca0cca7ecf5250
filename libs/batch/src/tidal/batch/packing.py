"""Padding-free packing: training samples concatenated into token-budget micro-batches.

`PackedMicroBatch` is the `MicroBatch` contract (trainer.proto) as numpy arrays, so the
torch-free orchestrator builds it. Entry t of `loss_mask`, `advantages` and
`behaviour_logprobs` scores `input_ids[t]` given the tokens before it: prompt tokens
carry mask 0 and logprob 0; a token's advantage is its sample's plus its own term. With
prompt sharing, samples of one prompt hold it once: the prompt is a sample of its own, each
completion a sample whose parent it is (`sample_parents`), positioned after it. Bins are
filled best-fit decreasing (deterministic); which rank trains which bin is `balance.py`'s
job. Over-long samples are never cut silently: `assign_bins` refuses them, `fit_to_budget`
truncates one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TrainSample:
    """One sequence to train on: a prompt and a completion with its per-token data."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    """The sample's advantage (1.0 for SFT samples, where it is unused): every completion
    token's advantage is this plus its entry of `token_advantages`."""
    completion_logprobs: tuple[float, ...] = ()
    """Behaviour logprob of each completion token; empty for SFT samples (read as zeros)."""
    completion_mask: tuple[float, ...] = ()
    """Loss mask of each completion token (0 for environment tokens of a multi-turn
    episode); empty means every completion token is trained."""
    completion_versions: tuple[int, ...] = ()
    """Policy version that sampled each completion token (-1 at environment tokens);
    empty means unknown (SFT samples)."""
    token_advantages: tuple[float, ...] = ()
    """Each completion token's own advantage term, added to `advantage` (a distillation
    signal, a process reward); empty means none (the sample's advantage on every token)."""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sample needs at least one prompt token (BOS)")
        if self.completion_logprobs and len(self.completion_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_logprobs)} logprobs for "
                f"{len(self.completion_ids)} completion tokens"
            )
        if self.completion_mask and len(self.completion_mask) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_mask)} mask entries for "
                f"{len(self.completion_ids)} completion tokens"
            )
        if self.completion_versions and len(self.completion_versions) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_versions)} versions for "
                f"{len(self.completion_ids)} completion tokens"
            )
        if self.token_advantages and len(self.token_advantages) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.token_advantages)} token advantages for "
                f"{len(self.completion_ids)} completion tokens"
            )

    def completion_advantages(self) -> np.ndarray:
        """float32 [completion tokens]: the advantage each completion token trains with."""
        n = len(self.completion_ids)
        per_token = np.asarray(self.token_advantages or (0.0,) * n, dtype=np.float64)
        return (self.advantage + per_token).astype(np.float32)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class PackedMicroBatch:
    """The MicroBatch fields as numpy arrays: T tokens of S samples."""

    input_ids: np.ndarray  # int32 [T]
    position_ids: np.ndarray  # int32 [T]
    sample_lengths: np.ndarray  # int32 [S]
    loss_mask: np.ndarray  # float32 [T]
    advantages: np.ndarray  # float32 [T], per token
    behaviour_logprobs: np.ndarray  # float32 [T]
    policy_versions: np.ndarray | None = None  # int32 [T], -1 = unknown; None: all unknown
    sample_parents: np.ndarray | None = None  # int32 [S], -1 = none; None: no sample has one
    rank: int = 0
    """The data-parallel rank that trains this micro-batch."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


def assign_bins(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Best-fit decreasing: indices of `lengths` grouped into bins of total ≤ budget."""
    too_long = [n for n in lengths if n > budget]
    if too_long:
        raise ValueError(
            f"a sample of {max(too_long)} tokens exceeds the micro-batch budget of {budget} "
            "tokens; raise orchestrator.packing.micro_batch_tokens or lower sampling.max_tokens"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    free: list[int] = []
    bins: list[list[int]] = []
    for i in order:
        fits = [b for b, room in enumerate(free) if lengths[i] <= room]
        if fits:
            best = min(fits, key=lambda b: free[b])  # the tightest fit; ties: oldest bin
            free[best] -= lengths[i]
            bins[best].append(i)
        else:
            free.append(budget - lengths[i])
            bins.append([i])
    return bins


def prompt_groups(samples: Sequence[TrainSample]) -> list[list[int]]:
    """Indices of `samples` grouped by identical prompt, in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.prompt_ids, []).append(i)
    return list(groups.values())


Columns = list[np.ndarray]  # input_ids, loss_mask, advantages, behaviour_logprobs, versions


def _prompt_columns(prompt_ids: tuple[int, ...], advantage: float) -> Columns:
    n = len(prompt_ids)
    return [
        np.asarray(prompt_ids, dtype=np.int32),
        np.zeros(n, dtype=np.float32),
        np.full(n, advantage, dtype=np.float32),
        np.zeros(n, dtype=np.float32),
        np.full(n, -1, dtype=np.int32),
    ]


def _completion_columns(s: TrainSample) -> Columns:
    n = len(s.completion_ids)
    return [
        np.asarray(s.completion_ids, dtype=np.int32),
        np.asarray(s.completion_mask or (1.0,) * n, dtype=np.float32),
        s.completion_advantages(),
        np.asarray(s.completion_logprobs or (0.0,) * n, dtype=np.float32),
        np.asarray(s.completion_versions or (-1,) * n, dtype=np.int32),
    ]


def build_micro_batch(
    samples: Sequence[TrainSample], *, rank: int = 0, share_prompts: bool = False
) -> PackedMicroBatch:
    """Concatenate samples into one padding-free micro-batch for data-parallel `rank`;
    with `share_prompts`, the completions of one prompt follow that prompt held once."""
    segments: list[Columns] = []
    positions: list[np.ndarray] = []
    parents: list[int] = []
    groups = prompt_groups(samples) if share_prompts else [[i] for i in range(len(samples))]
    for group in groups:
        # A sample without completion tokens has nothing to share: it keeps its own prompt.
        alone = [i for i in group if not samples[i].completion_ids]
        shared = [i for i in group if samples[i].completion_ids]
        if len(shared) == 1:
            alone, shared = [*alone, *shared], []
        for s in (samples[i] for i in alone):
            prompt, completion = (
                _prompt_columns(s.prompt_ids, s.advantage),
                _completion_columns(s),
            )
            segments.append([np.concatenate(pair) for pair in zip(prompt, completion, strict=True)])
            positions.append(np.arange(s.num_tokens, dtype=np.int32))
            parents.append(-1)
        if not shared:
            continue
        prompt_ids = samples[shared[0]].prompt_ids
        parent = len(parents)
        segments.append(_prompt_columns(prompt_ids, 0.0))
        positions.append(np.arange(len(prompt_ids), dtype=np.int32))
        parents.append(-1)
        for s in (samples[i] for i in shared):
            segments.append(_completion_columns(s))
            positions.append(np.arange(len(s.completion_ids), dtype=np.int32) + len(prompt_ids))
            parents.append(parent)
    ids, mask, adv, logp, versions = (
        np.concatenate(column) for column in zip(*segments, strict=True)
    )
    return PackedMicroBatch(
        input_ids=ids,
        position_ids=np.concatenate(positions),
        sample_lengths=np.asarray([len(seg[0]) for seg in segments], dtype=np.int32),
        loss_mask=mask,
        advantages=adv,
        behaviour_logprobs=logp,
        policy_versions=versions,
        sample_parents=np.asarray(parents, dtype=np.int32) if max(parents) >= 0 else None,
        rank=rank,
    )


def fit_to_budget(sample: TrainSample, budget: int) -> TrainSample | None:
    """The sample cut to its first `budget` tokens; None when no completion token is left."""
    if sample.num_tokens <= budget:
        return sample
    keep = budget - len(sample.prompt_ids)
    if keep <= 0:
        return None
    return TrainSample(
        prompt_ids=sample.prompt_ids,
        completion_ids=sample.completion_ids[:keep],
        advantage=sample.advantage,
        completion_logprobs=sample.completion_logprobs[:keep],
        completion_mask=sample.completion_mask[:keep],
        completion_versions=sample.completion_versions[:keep],
        token_advantages=sample.token_advantages[:keep],
    )
