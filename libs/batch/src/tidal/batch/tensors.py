"""The packed micro-batch as torch tensors (the trainer's compute type), and its validation.

`MicroBatchData` mirrors the `MicroBatch` contract: ids and positions int64 (what
embedding lookups index with), the rest fp32. `micro_batch_from_packed` is the one
numpy → torch conversion, for RL steps and `tidal sft` alike. Validation raises
InvalidArgument naming the field, and refuses a loss on a sample's first token (it has
no prediction inside its sample) rather than drop it: it means the sender's alignment is
off by one. A sample with a parent continues it, so its first token is predicted at the
parent's last (`prediction_index`). The only module of `tidal.batch` that imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from tidal.batch.packing import PackedMicroBatch
from tidal.common.errors import InvalidArgument

TOKEN_FIELDS = ("input_ids", "position_ids", "loss_mask", "advantages", "behaviour_logprobs")


@dataclass(frozen=True)
class MicroBatchData:
    input_ids: torch.Tensor  # (T,) int64
    position_ids: torch.Tensor  # (T,) int64, restarting at 0 for each sample
    sample_lengths: torch.Tensor  # (S,) int64, sums to T
    loss_mask: torch.Tensor  # (T,) float32, 1 = trained token
    advantages: torch.Tensor  # (T,) float32, per token (a sample's value or varying along it)
    behaviour_logprobs: torch.Tensor  # (T,) float32
    policy_versions: torch.Tensor | None = None
    """(T,) int64 version that sampled each token, -1 where unknown; None: all unknown."""
    sample_parents: torch.Tensor | None = None
    """(S,) int64 sample each sample continues (its shared prompt), -1: none; None: none."""
    rank: int = 0
    """The data-parallel rank that trains this micro-batch."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def to(self, device: Any) -> MicroBatchData:
        return replace(
            self,
            **{
                name: getattr(self, name).to(device, non_blocking=True)
                for name in _COMPUTE_DTYPES
                if getattr(self, name) is not None
            },
        )


# Compute dtype of each field; torch.from_numpy keeps it (ids int64, the rest fp32).
_COMPUTE_DTYPES: dict[str, np.dtype] = {
    "input_ids": np.dtype(np.int64),
    "position_ids": np.dtype(np.int64),
    "sample_lengths": np.dtype(np.int64),
    "loss_mask": np.dtype(np.float32),
    "advantages": np.dtype(np.float32),
    "behaviour_logprobs": np.dtype(np.float32),
    "policy_versions": np.dtype(np.int64),
    "sample_parents": np.dtype(np.int64),
}


def micro_batch_from_packed(packed: PackedMicroBatch) -> MicroBatchData:
    """Torch tensors in the compute dtypes, owning their memory (one copy per field).

    The copy matters: decoded arrays are read-only views of a request's bytes.
    """
    arrays = {name: getattr(packed, name) for name in _COMPUTE_DTYPES}
    return MicroBatchData(
        **{
            name: None if array is None else torch.from_numpy(np.array(array, dtype=dtype))
            for (name, dtype), array in zip(_COMPUTE_DTYPES.items(), arrays.values(), strict=True)
        },
        rank=packed.rank,
    )


def positions_for(
    sample_lengths: torch.Tensor, sample_parents: torch.Tensor | None = None
) -> torch.Tensor:
    """Positions restarting at 0 per sample, or after its parent's length: (S,) → (T,)."""
    total = int(sample_lengths.sum().item())
    starts = torch.cumsum(sample_lengths, 0) - sample_lengths  # (S,) first index of each sample
    first = torch.zeros_like(sample_lengths)  # (S,) position of each sample's first token
    if sample_parents is not None:
        has_parent = sample_parents >= 0
        first[has_parent] = sample_lengths[sample_parents[has_parent]]
    return torch.arange(total) - torch.repeat_interleave(starts - first, sample_lengths)


def segment_ids(sample_lengths: torch.Tensor) -> torch.Tensor:
    """Index of the sample each token belongs to: (S,) lengths → (T,) int64."""
    return torch.repeat_interleave(
        torch.arange(sample_lengths.shape[0], device=sample_lengths.device), sample_lengths
    )


def prediction_index(
    sample_lengths: torch.Tensor, sample_parents: torch.Tensor | None
) -> torch.Tensor | None:
    """(T-1,) row index whose logits score tokens 1..T-1: the one before, but the parent's
    last token for a sample's first; None when no sample has a parent (then t-1 for all)."""
    if sample_parents is None or not bool((sample_parents >= 0).any()):
        return None
    ends = torch.cumsum(sample_lengths, 0)  # (S,) one past each sample's last token
    index = torch.arange(int(ends[-1]), device=sample_lengths.device) - 1  # (T,)
    children = torch.nonzero(sample_parents >= 0).squeeze(1)  # (C,)
    index[ends[children] - sample_lengths[children]] = ends[sample_parents[children]] - 1
    return index[1:]


def validate_micro_batch(
    batch: MicroBatchData, *, field: str, vocab_size: int, max_seq_len: int
) -> None:
    """Raise InvalidArgument(`{field}.<tensor>`, ...) unless `batch` honours the contract."""
    t = batch.num_tokens
    for name in TOKEN_FIELDS + ("policy_versions",) * (batch.policy_versions is not None):
        shape = tuple(getattr(batch, name).shape)
        if len(shape) != 1:
            raise InvalidArgument(f"{field}.{name}", f"must be 1-D [T], got shape {list(shape)}")
        if shape[0] != t:
            raise InvalidArgument(
                f"{field}.{name}", f"has {shape[0]} entries, input_ids has {t} (all must be [T])"
            )
    if t == 0:
        raise InvalidArgument(f"{field}.input_ids", "is empty; a micro-batch needs tokens")
    lengths = batch.sample_lengths
    if lengths.dim() != 1 or lengths.numel() == 0:
        raise InvalidArgument(
            f"{field}.sample_lengths",
            f"must be 1-D [S] with S >= 1, got shape {list(lengths.shape)}",
        )
    if int(lengths.min()) < 1:
        raise InvalidArgument(f"{field}.sample_lengths", "every sample needs at least 1 token")
    if int(lengths.max()) > max_seq_len:
        raise InvalidArgument(
            f"{field}.sample_lengths",
            f"a sample has {int(lengths.max())} tokens, more than the model's "
            f"max_seq_len {max_seq_len}",
        )
    if int(lengths.sum()) != t:
        raise InvalidArgument(
            f"{field}.sample_lengths", f"sums to {int(lengths.sum())}, but input_ids has {t} tokens"
        )
    ids = batch.input_ids
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
        raise InvalidArgument(
            f"{field}.input_ids", f"token id {bad} is outside the vocabulary [0, {vocab_size})"
        )
    _validate_parents(batch, field, max_seq_len)
    if not torch.equal(batch.position_ids, positions_for(lengths, batch.sample_parents)):
        raise InvalidArgument(
            f"{field}.position_ids",
            "must count 0, 1, … within each sample of sample_lengths (from its parent's "
            "length for a sample with a parent)",
        )
    _validate_floats(batch, field)


def _validate_parents(batch: MicroBatchData, field: str, max_seq_len: int) -> None:
    parents = batch.sample_parents
    if parents is None:
        return
    if tuple(parents.shape) != tuple(batch.sample_lengths.shape):
        raise InvalidArgument(
            f"{field}.sample_parents",
            f"must be [S] like sample_lengths, got shape {list(parents.shape)}",
        )
    index = torch.arange(parents.shape[0])
    if bool(((parents < -1) | (parents >= index)).any()):
        raise InvalidArgument(f"{field}.sample_parents", "a parent must be -1 or an earlier sample")
    has_parent = parents >= 0
    if bool((parents[parents[has_parent]] >= 0).any()):
        raise InvalidArgument(f"{field}.sample_parents", "a parent must not have a parent itself")
    lengths = batch.sample_lengths
    with_parent = lengths[has_parent] + lengths[parents[has_parent]]  # (C,) positions each
    if with_parent.numel() and int(with_parent.max()) > max_seq_len:
        raise InvalidArgument(
            f"{field}.sample_parents",
            f"a sample and its parent have {int(with_parent.max())} tokens, more than the "
            f"model's max_seq_len {max_seq_len}",
        )
    segments = torch.repeat_interleave(index, batch.sample_lengths)  # (T,)
    is_parent = torch.zeros_like(has_parent).index_fill_(0, parents[has_parent], True)  # (S,)
    if bool((batch.loss_mask[is_parent[segments]] != 0).any()):
        raise InvalidArgument(
            f"{field}.loss_mask",
            "is 1 in a parent sample (a shared prompt), whose tokens stand for every child's",
        )


def _validate_floats(batch: MicroBatchData, field: str) -> None:
    for name in ("loss_mask", "advantages", "behaviour_logprobs"):
        if not bool(torch.isfinite(getattr(batch, name)).all()):
            raise InvalidArgument(f"{field}.{name}", "contains NaN or infinite values")
    mask = batch.loss_mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise InvalidArgument(f"{field}.loss_mask", "values must be 0 or 1")
    starts = torch.cumsum(batch.sample_lengths, 0) - batch.sample_lengths  # (S,)
    if batch.sample_parents is not None:  # a child's first token is predicted by its parent
        starts = starts[batch.sample_parents < 0]
    if bool((mask[starts] != 0).any()):
        raise InvalidArgument(
            f"{field}.loss_mask",
            "is 1 at a sample's first token, which has no prediction inside its sample "
            "(entry t scores input_ids[t] given the tokens before it)",
        )
