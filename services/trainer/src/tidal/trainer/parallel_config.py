"""`[trainer.parallel]`: how the trainer's torchrun ranks divide the model and the batch.

pydantic only (no torch), so `--help` and `--dry-run` stay instant. `check_parallel`,
called by the trainer config's validator, resolves the factors against
`trainer.world_size` (`ParallelDims`, which shows the arithmetic) and checks what relates
them to `[trainer.model]` and `[trainer.loss]`, so a bad combination fails, naming both
sections' fields, before torchrun starts anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Protocol

from pydantic import Field

from tidal.common.config.loading import BaseConfig
from tidal.common.errors import ConfigError
from tidal.models.families import MOE_FAMILIES
from tidal.trainer.parallel.dims import ParallelDims


# What `check_parallel` reads of `[trainer.model]` and `[trainer.loss]`, as structural types:
# `tidal.trainer.config` composes this section, so importing its classes here would be an
# import cycle (the two sections' relation is checked here, where the parallel dims live).
class ModelShape(Protocol):
    @property
    def path(self) -> Path | None: ...
    @property
    def family(self) -> str: ...
    @property
    def n_experts(self) -> int: ...
    @property
    def attn(self) -> str: ...
    @property
    def n_heads(self) -> int: ...


class LossShape(Protocol):
    @property
    def norm(self) -> str: ...
    @property
    def ratio_level(self) -> str: ...


# Attention kernels the CP backends can stand in for (ring and Ulysses compute the
# packed causal attention themselves; flash-attn's varlen kernel has no CP variant here).
CP_ATTENTION = ("sdpa",)


class ParallelConfig(BaseConfig):
    dp_replicate: int = Field(default=1, ge=1)
    """HSDP replica groups: parameters are sharded within a group and replicated
    (gradients all-reduced) across groups. 1 = plain FSDP."""
    dp_shard: int = -1
    """Ranks each parameter is sharded over (FSDP); -1 = what is left of world_size after
    dp_replicate × cp."""
    cp: int = Field(default=1, ge=1)
    """Context-parallel ranks: each packed row is split along tokens over them."""
    cp_style: Literal["ring", "ulysses"] = "ring"
    """CP attention: "ring" passes key/value blocks round the ranks (any head count);
    "ulysses" all-to-alls heads (needs n_heads divisible by cp)."""
    ep: int = Field(default=1, ge=1)
    """Expert-parallel ranks (MoE families), taken from the dp_shard ranks: must divide
    dp_shard and the model's n_experts. The dp_shard ranks form dp_shard / ep groups of
    ep ranks; each group holds every expert once (docs/distributed.md)."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """FSDP mixed precision: dtype parameters are gathered in for compute."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """FSDP mixed precision: dtype gradients are reduced in."""
    reshard_after_forward: bool = True
    """Free gathered parameters after each block's forward (gathered again in backward):
    less memory, one more all-gather per block."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: "auto" is NCCL on CUDA, gloo on CPU."""

    moved_keys: ClassVar[dict[str, str]] = {"cpu_offload": "trainer.model.fsdp_cpu_offload"}
    moved_keys_until: ClassVar[str] = "2027-03-01"


def check_parallel(
    world_size: int,
    parallel: ParallelConfig,
    model: ModelShape,
    loss: LossShape | None = None,
) -> ParallelDims:
    """Resolve the dims and check them against the model; ConfigError names the fields."""
    dims = ParallelDims.build(
        world_size=world_size,
        dp_replicate=parallel.dp_replicate,
        dp_shard=parallel.dp_shard,
        cp=parallel.cp,
        ep=parallel.ep,
    )
    if dims.ep > 1 and model.path is None:  # a folder's experts are checked when it loads
        if model.family not in MOE_FAMILIES:
            raise ConfigError(
                f"trainer.parallel.ep = {dims.ep} needs a mixture-of-experts model, but "
                f"trainer.model.family is {model.family!r}"
            )
        if model.n_experts % dims.ep:
            raise ConfigError(
                f"trainer.parallel.ep = {dims.ep} must divide trainer.model.n_experts = "
                f"{model.n_experts}"
            )
    if dims.ep > 1 and dims.cp > 1:
        # EP groups are taken from the dp_shard ranks (ep.py); routing tokens of CP ranks
        # (which share weights but hold different tokens) is not implemented.
        raise ConfigError(
            f"trainer.parallel.ep = {dims.ep} cannot be combined with trainer.parallel.cp "
            f"= {dims.cp}; use cp = 1 with ep, or ep = 1 with cp"
        )
    if dims.cp > 1 and loss is not None and "sequence" in (loss.norm, loss.ratio_level):
        raise ConfigError(
            f"trainer.parallel.cp = {dims.cp} splits samples over ranks, which "
            f"trainer.loss.norm = {loss.norm!r} / trainer.loss.ratio_level = "
            f"{loss.ratio_level!r} cannot take (they need whole samples on one rank); "
            'use "token" for both, or cp = 1'
        )
    if dims.cp > 1 and loss is not None and loss.trust_region.per_sequence:
        raise ConfigError(
            f"trainer.parallel.cp = {dims.cp} splits samples over ranks, which the "
            "sequence and geometric-mean bounds of trainer.loss.trust_region cannot take "
            "(they need whole samples on one rank); unset them, or use cp = 1"
        )
    if dims.cp > 1:
        if model.attn not in CP_ATTENTION:
            raise ConfigError(
                f"trainer.parallel.cp = {dims.cp} (cp_style {parallel.cp_style!r}) does not "
                f'support trainer.model.attn = {model.attn!r}; use model.attn = "sdpa" '
                "(the CP backends replace the packed kernel) or cp = 1"
            )
        if parallel.cp_style == "ulysses" and model.n_heads % dims.cp:
            raise ConfigError(
                f'trainer.parallel.cp_style = "ulysses" needs trainer.model.n_heads '
                f"({model.n_heads}) divisible by trainer.parallel.cp ({dims.cp}); use "
                'cp_style = "ring"'
            )
    return dims
