"""Valid `MicroBatch` messages for trainer tests: packed samples of the byte vocabulary."""

from __future__ import annotations

import numpy as np

from tidal.batch.tensor_codec import encode_array
from tidal.rpc.v1 import trainer_pb2 as pb

PROMPT_TOKENS = 2
"""Leading tokens of each sample that are prompt (loss mask 0)."""


def wire_micro_batch(
    lengths: list[int], *, seed: int = 0, rank: int = 0, **override: np.ndarray
) -> pb.MicroBatch:
    """Samples of `lengths` tokens packed into one micro-batch, random ids and advantages
    from `seed`; `override` replaces any tensor by name."""
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    starts = np.cumsum(lengths) - lengths
    positions = np.arange(total) - np.repeat(starts, lengths)  # (T,)
    mask = (positions >= PROMPT_TOKENS).astype(np.float32)
    advantages = np.repeat(rng.standard_normal(len(lengths)), lengths) * mask
    arrays = {
        "input_ids": rng.integers(0, 259, total).astype(np.int32),
        "position_ids": positions.astype(np.int32),
        "sample_lengths": np.array(lengths, dtype=np.int32),
        "loss_mask": mask,
        "advantages": advantages.astype(np.float32),
        "behaviour_logprobs": (-5.6 * mask).astype(np.float32),
        "policy_versions": np.where(mask > 0, 0, -1).astype(np.int32),  # sampled by version 0
        **override,
    }
    return pb.MicroBatch(rank=rank, **{name: encode_array(a) for name, a in arrays.items()})
