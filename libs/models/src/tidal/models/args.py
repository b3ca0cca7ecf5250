"""`DecoderArgs`: the one shape description every decoder family is built from.

Llama, Qwen2, Qwen3 and the MoE variants differ by a handful of switches, so one frozen
dataclass carries them all and the shared blocks (`layers.py`, `moe.py`) read them; no
block code is copied per family. The HF `config.json` mapping is the family record's
(`families.py`). Equality compares every field: "same architecture" to callers that
hot-swap weights (inference refuses a version whose args differ).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tidal.models.families import family_for_hf_config, family_of
from tidal.models.rope_scaling import ROPE_TYPES, RopeScaling

__all__ = ["ROPE_TYPES", "DecoderArgs", "RopeScaling"]


@dataclass(frozen=True)
class DecoderArgs:
    # The first seven fields may be given positionally: DecoderArgs(264, 48, 1, 4, 2, 64, 64).
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
    head_dim: int = 0  # 0: dim // n_heads (Llama, Qwen2); Qwen3 configs state it
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
        return family_of(self.family).hf_config(self.as_dict())

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> DecoderArgs:
        """Args from a Hugging Face `config.json` of any supported architecture."""
        return cls(**family_for_hf_config(config).args_fields(config))
