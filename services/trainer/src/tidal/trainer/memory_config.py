"""Configuration of the memory levers under `[trainer.model]` (pydantic only, no torch).

Every lever is off by default; setting its section turns it on with its defaults. What
can be checked without a model is checked here, what needs the model when the lever is
applied, and what depends on how the trainer started (FSDP or not: the launcher may set
`trainer.world_size` after validation) by `check_levers_at_start`. The memory planner
reads these same classes, so their field names are its contract.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig
from tidal.common.errors import ConfigError


class ActivationCheckpointConfig(BaseConfig):
    """`[trainer.model.ac]`: recompute activations in the backward pass instead of keeping them."""

    mode: Literal["full", "selective"] = "full"
    """"full": checkpoint whole decoder blocks (every `freq`-th one); "selective": checkpoint
    only the `targets` submodules inside every block."""
    freq: int = Field(default=1, ge=1)
    """full: checkpoint every `freq`-th block (1 = all blocks, 2 = blocks 0, 2, 4, ...)."""
    targets: list[Literal["norm", "attn_proj", "attention", "mlp"]] = ["norm", "mlp"]
    """selective: what to recompute in each block: "norm" (the RMSNorms), "attn_proj" (the
    q/k/v/o projections), "attention" (the whole attention sub-block), "mlp" (the
    feed-forward, dense or MoE)."""

    @model_validator(mode="after")
    def _check_targets(self) -> ActivationCheckpointConfig:
        if self.mode == "selective" and not self.targets:
            raise ValueError('ac.targets must name at least one target when ac.mode = "selective"')
        if "attention" in self.targets and "attn_proj" in self.targets:
            raise ValueError(
                'ac.targets: "attention" already recomputes the projections; drop "attn_proj"'
            )
        return self


class ActivationOffloadingConfig(BaseConfig):
    """`[trainer.model.ac_offloading]`: keep saved activations in host memory until backward."""

    max_inflight_activations: int = Field(default=4, ge=1)
    """Saved tensors in flight at once: device→host copies not yet waited for in forward,
    and host→device copies issued ahead of use in backward."""
    min_offload_bytes: int = Field(default=1024, ge=0)
    """Saved tensors smaller than this stay on the device (copying costs more than it saves)."""


class LoRAConfig(BaseConfig):
    """`[trainer.model.lora]`: train low-rank adapters B·A on frozen base weights."""

    rank: int = Field(default=8, gt=0)
    """Rank r of each adapter (A is r × in, B is out × r)."""
    alpha: float = Field(default=16.0, gt=0)
    """Scale numerator: the update is (alpha / rank) · B·A·x."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input (training only)."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """Names of the linear layers that get adapters (matched against the last component of
    each module name, e.g. "q_proj", "gate_proj"); each must match at least one module."""
    publish: Literal["adapters", "merged"] = "adapters"
    """What weight versions after 0 carry: "adapters" (only the lora_A/lora_B tensors plus
    `adapter_config`; replicas merge them onto the version-0 base: docs/weightsync.md) or
    "merged" (full weights with B·A folded in, for consumers that cannot apply adapters)."""

    @model_validator(mode="after")
    def _check_targets(self) -> LoRAConfig:
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module")
        return self


class CompileConfig(BaseConfig):
    """`[trainer.model.compile]`: torch.compile each decoder block separately."""

    backend: str = "inductor"
    """torch.compile backend ("inductor"; "aot_eager" compiles faster, for tests)."""
    fullgraph: bool = False
    """Refuse graph breaks inside a block."""
    dynamic: bool | None = None
    """Dynamic shapes (packed micro-batches vary in length); None lets torch decide."""


class TruncationConfig(BaseConfig):
    """`[trainer.model.truncation]`: cap sample lengths in trained micro-batches."""

    max_prompt_tokens: int | None = Field(default=None, gt=0)
    """Keep at most this many prompt tokens per sample (the last ones, nearest the completion)."""
    max_completion_tokens: int | None = Field(default=None, gt=0)
    """Keep at most this many completion tokens per sample (the first ones)."""
    max_total_tokens: int | None = Field(default=None, gt=1)
    """Keep at most this many tokens per sample in all (completion tail cut first)."""


def check_lever_combination(model: Any) -> None:
    """Raise ValueError naming the fields when levers set on `model` (a ModelConfig) clash."""
    chunk = model.fused_lm_head_token_chunk_size
    if isinstance(chunk, int) and chunk <= 0:
        raise ValueError(
            f"fused_lm_head_token_chunk_size must be > 0 (or 'auto' / 'disabled'), got {chunk}"
        )
    ac = model.ac
    if ac is not None and ac.mode == "selective" and ac.freq != 1:
        raise ValueError('ac.freq applies to ac.mode = "full" only; remove it or use "full"')
    if model.impl == "hf" and chunk != "disabled":
        raise ValueError(
            'fused_lm_head_token_chunk_size needs model.impl = "custom" (or "auto" for an '
            'architecture we implement): model.impl = "hf" gives no hidden states to chunk'
        )


def check_levers_at_start(model: Any, *, sharded: bool) -> None:
    """Raise ConfigError naming the field for a lever `model` (a ModelConfig) sets that this
    start of the trainer cannot apply; `sharded`: FSDP wraps the model (torchrun)."""
    if model.fsdp_cpu_offload and not sharded:
        raise ConfigError(
            "trainer.model.fsdp_cpu_offload needs FSDP, which the trainer applies only with "
            "trainer.world_size > 1; at world size 1 keep the optimizer states off the "
            "device with trainer.optim.optim_cpu_offload or optim_offload instead"
        )
