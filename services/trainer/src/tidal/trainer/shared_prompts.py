"""Which trainer settings train micro-batches whose samples share a prompt, and the refusal.

A shared prompt is a parent sample (`MicroBatchData.sample_parents`): its completions see
it, continue its positions and are scored from its last token, and everything after the
logprobs (normalizations, KL, off-policy corrections, the router's token counts) sees
the same per-token values as the unshared row. Context parallelism, truncation and
flash-attn's varlen kernel do not handle parents: such a step is refused naming the
setting, before any forward. Torch-free, so `tidal rl` checks a run's config with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidal.common.errors import InvalidArgument
from tidal.trainer.config import TrainerConfig

if TYPE_CHECKING:
    from tidal.batch.tensors import MicroBatchData

TURN_OFF = "orchestrator.packing.share_prompts = false"


def shared_prompt_conflicts(config: TrainerConfig, *, cp: int) -> list[str]:
    """The settings of `config` (and context-parallel degree `cp`) that refuse shared
    prompts, each with what to change; empty when they train."""
    conflicts = []
    if cp > 1:
        conflicts.append(f"trainer.parallel.cp = {cp} (context parallelism needs cp = 1)")
    truncation = config.model.truncation
    caps = {
        "max_prompt_tokens": truncation.max_prompt_tokens,
        "max_completion_tokens": truncation.max_completion_tokens,
        "max_total_tokens": truncation.max_total_tokens,
    }
    for name, value in caps.items():
        if value is not None:
            conflicts.append(f"trainer.model.truncation.{name} = {value} (truncation: unset it)")
    if config.model.attn == "flash_attention_2":
        conflicts.append('trainer.model.attn = "flash_attention_2" (use "sdpa")')
    return conflicts


def has_shared_prompts(batch: MicroBatchData) -> bool:
    parents = batch.sample_parents
    return parents is not None and bool((parents >= 0).any())


def check_shared_prompts(
    batches: Sequence[MicroBatchData], config: TrainerConfig, *, cp: int
) -> None:
    """Raise InvalidArgument when a micro-batch shares prompts that this trainer's
    settings cannot train."""
    shared = [i for i, b in enumerate(batches) if has_shared_prompts(b)]
    if not shared:
        return
    conflicts = shared_prompt_conflicts(config, cp=cp)
    if conflicts:
        raise InvalidArgument(
            f"micro_batches[{shared[0]}].sample_parents",
            "shares prompts, which this trainer does not train with "
            f"{'; '.join(conflicts)}; or send unshared micro-batches ({TURN_OFF})",
        )
