"""`DecoderArgs`: the one shape description every decoder family is built from.

Decisions:
- Llama, Qwen2, Qwen3 and the MoE variants differ by a handful of switches (attention
  biases, QK-norm, an explicit head dim, RoPE scaling, a mixture-of-experts feed-forward),
  so one frozen dataclass carries them all and the shared blocks (`layers.py`, `moe.py`)
  read the switches. A family module only maps its Hugging Face `config.json` to and
  from these args and names what it supports; no block code is copied per family.
- Field order of the first ten fields is the original `LlamaArgs` order, so positional
  construction (`DecoderArgs(264, 48, 1, 4, 2, 64, 64)`) keeps working.
- `head_dim = 0` means `dim // n_heads` (Llama, Qwen2); Qwen3 configs state it explicitly.
- Equality compares every field, which is what "same architecture" means to callers that
  hot-swap weights (inference refuses a version whose args differ).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidal.trainer.config import ModelConfig

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: "linear" (positions / factor) or Llama 3.1's "llama3"."""

    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise ValueError(
                f"rope scaling type {self.type!r} is not supported; supported: {ROPE_TYPES}"
            )
        if self.type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"llama3 rope scaling needs high_freq_factor ({self.high_freq_factor}) > "
                f"low_freq_factor ({self.low_freq_factor})"
            )


@dataclass(frozen=True)
class DecoderArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    family: str = "llama"
    head_dim: int = 0  # 0: dim // n_heads
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False  # biases on q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3)
    # Mixture of experts (0 experts: every block is dense).
    n_experts: int = 0
    n_experts_per_tok: int = 0
    moe_ffn_dim: int = 0
    norm_topk_prob: bool = True
    shared_expert_ffn_dim: int = 0  # 0: no shared expert
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = field(default_factory=tuple)
    router_aux_loss_coef: float = 0.001

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            if self.dim % self.n_heads:
                raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if isinstance(self.rope_scaling, dict):  # from as_dict()
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.n_experts:
            if not 0 < self.n_experts_per_tok <= self.n_experts:
                raise ValueError(
                    f"n_experts_per_tok {self.n_experts_per_tok} must be in [1, n_experts "
                    f"{self.n_experts}]"
                )
            if self.moe_ffn_dim <= 0:
                raise ValueError("moe_ffn_dim must be positive when n_experts > 0")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block `layer` has a mixture-of-experts feed-forward (HF's rule)."""
        return (
            self.n_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_hf_config(self) -> dict[str, Any]:
        """The Hugging Face `config.json` of this architecture (its family's mapping)."""
        from tidal.trainer.models.families import family_of

        return family_of(self.family).to_hf_config(self)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> DecoderArgs:
        """Args from a Hugging Face `config.json` of any supported architecture."""
        from tidal.trainer.models.families import family_for_hf_config

        return family_for_hf_config(config).from_hf_config(config)


def args_from_config(config: ModelConfig) -> DecoderArgs:
    """`DecoderArgs` of a config-built model (`config.path` unset). Torch-free, so the
    memory planner and the model factory read a config the same way."""
    from tidal.trainer.config import MOE_FAMILIES  # config imports no model code

    moe = config.family in MOE_FAMILIES
    scaling = config.rope_scaling
    return DecoderArgs(
        vocab_size=config.vocab_size,
        dim=config.dim,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        ffn_dim=config.ffn_dim,
        max_seq_len=config.max_seq_len,
        rope_theta=config.rope_theta,
        norm_eps=config.norm_eps,
        tie_embeddings=config.tie_embeddings,
        family=config.family,
        head_dim=config.head_dim or 0,
        rope_scaling=RopeScaling(**scaling.model_dump()) if scaling is not None else None,
        attention_bias=config.family in ("qwen2", "qwen2_moe"),
        qk_norm=config.family in ("qwen3", "qwen3_moe"),
        n_experts=config.n_experts if moe else 0,
        n_experts_per_tok=config.n_experts_per_tok if moe else 0,
        moe_ffn_dim=config.moe_ffn_dim if moe else 0,
        norm_topk_prob=config.norm_topk_prob,
        shared_expert_ffn_dim=config.shared_expert_ffn_dim if moe else 0,
        decoder_sparse_step=config.decoder_sparse_step,
        router_aux_loss_coef=config.router_aux_loss_coef,
    )
