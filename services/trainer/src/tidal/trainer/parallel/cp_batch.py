"""A packed micro-batch as one context-parallel rank sees it: its zigzag share of tokens.

The row is padded to a multiple of 2·cp with a pad "sample" (its own segment id, so no
real token attends to it), then split with `cp.shard_indices`. Next-token targets cross
shard boundaries, so they are addressed by global index: `target_index` says which token
each of the rank's tokens predicts and `valid` whether that is a real token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tidal.batch.tensors import MicroBatchData, segment_ids
from tidal.models.attention import AttentionBackend
from tidal.trainer.parallel.cp import RingAttention, UlyssesAttention, shard_indices


@dataclass(frozen=True)
class CPShard:
    input_ids: torch.Tensor  # (1, n) this rank's tokens
    position_ids: torch.Tensor  # (1, n)
    attention: AttentionBackend
    target_index: torch.Tensor  # (n,) index into the unpadded row of the token each predicts
    valid: torch.Tensor  # (n,) float: 1 where that target is a real token


def shard_for_cp(batch: MicroBatchData, *, cp: int, rank: int, style: str, group: Any) -> CPShard:
    t = batch.num_tokens
    padded = -(-t // (2 * cp)) * (2 * cp)
    pad = padded - t
    device = batch.input_ids.device
    ids = torch.cat([batch.input_ids, torch.zeros(pad, dtype=torch.long, device=device)])
    positions = torch.cat([batch.position_ids, torch.arange(pad, device=device)])
    samples = int(batch.sample_lengths.shape[0])
    segments = torch.cat(
        [segment_ids(batch.sample_lengths.cpu()), torch.full((pad,), samples)]
    )  # (T_pad,) pad tokens form their own segment
    every = torch.cat([shard_indices(padded, cp, r) for r in range(cp)])  # (T_pad,) rank order
    mine = shard_indices(padded, cp, rank)  # (n,)
    backend_cls = RingAttention if style == "ring" else UlyssesAttention
    attention = backend_cls(group, every.to(device), segments.to(device))  # masks on device
    target = mine + 1
    valid = (target < t).to(torch.float32)
    mine_d = mine.to(device)
    return CPShard(
        input_ids=ids[mine_d][None],
        position_ids=positions[mine_d][None],
        attention=attention,
        target_index=target.clamp(max=t - 1).to(device),
        valid=valid.to(device),
    )
