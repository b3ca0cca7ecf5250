"""Configuration of the trainer service (`[trainer]`).

pydantic only (no torch import), so the umbrella CLI can validate a whole run config and
print `--help` instantly. The defaults are the embedded CPU run: a ~0.4M-parameter Llama
over the byte tokenizer, trained in fp32 with AdamW on one thread.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tidal.common.config import BaseConfig
from tidal.common.sections import ServiceRunConfig
from tidal.common.tokenizer import ByteTokenizer

Family = Literal["llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe"]
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe")
# Architecture fields: taken from the folder's config.json when `path` is set.
ARCHITECTURE_FIELDS = (
    "family", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
    "max_seq_len", "rope_theta", "rope_scaling", "norm_eps", "tie_embeddings", "n_experts",
    "n_experts_per_tok", "moe_ffn_dim", "norm_topk_prob", "shared_expert_ffn_dim",
    "decoder_sparse_step", "router_aux_loss_coef",
)  # fmt: skip


class RopeScalingConfig(BaseConfig):
    """RoPE frequency scaling (Hugging Face's `rope_parameters` of the same names)."""

    type: Literal["linear", "llama3"] = "llama3"
    """"linear" divides every frequency by `factor`; "llama3" is Llama 3.1's smooth scaling."""
    factor: float = Field(default=8.0, gt=0)
    """Context extension factor."""
    low_freq_factor: float = Field(default=1.0, gt=0)
    """llama3: wavelengths above original_max_position_embeddings / low_freq_factor are scaled."""
    high_freq_factor: float = Field(default=4.0, gt=0)
    """llama3: wavelengths below original_max_position_embeddings / high_freq_factor are kept."""
    original_max_position_embeddings: int = Field(default=8192, gt=0)
    """llama3: the context length the model was pre-trained with."""


class ModelConfig(BaseConfig):
    family: Family = "llama"
    """Model family: "llama" (GQA, RoPE, RMSNorm, SwiGLU), "qwen2" (+ q/k/v biases), "qwen3"
    (+ QK-norm), "qwen3_moe" (Qwen3 with mixture-of-experts blocks), "qwen2_moe" (Qwen2
    attention, experts plus a shared expert)."""
    path: Path | None = None
    """Local Hugging Face model folder (config.json + model.safetensors, or shards with
    model.safetensors.index.json) to start from. Its config.json then defines the
    architecture: setting architecture fields as well is an error."""
    impl: Literal["auto", "custom", "hf"] = "auto"
    """Which implementation runs the model: "custom" (ours), "hf" (transformers'
    AutoModelForCausalLM, needs `transformers`), "auto" (ours where the architecture is
    supported, else transformers')."""
    attn: Literal["sdpa", "flash_attention_2"] = "sdpa"
    """Attention kernel for packed micro-batches: "sdpa" (torch SDPA with a block-diagonal
    causal mask; CPU and GPU) or "flash_attention_2" (flash_attn_varlen_func; needs the
    flash-attn package and a CUDA device)."""
    dim: int = Field(default=128, gt=0)
    """Hidden size."""
    n_layers: int = Field(default=2, gt=0)
    """Number of decoder blocks."""
    n_heads: int = Field(default=4, gt=0)
    """Attention (query) heads."""
    n_kv_heads: int = Field(default=2, gt=0)
    """Key/value heads (grouped-query attention); must divide `n_heads`."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head size; unset means dim / n_heads (Qwen3 models set it explicitly)."""
    ffn_dim: int = Field(default=352, gt=0)
    """Inner size of the SwiGLU feed-forward block (dense blocks)."""
    vocab_size: int = Field(default=264, gt=0)
    """Embedding rows; at least the tokenizer's vocabulary (259 for "byte"), padded up is fine."""
    max_seq_len: int = Field(default=128, gt=0)
    """Longest sample (prompt + completion) in tokens; sizes the RoPE tables."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base frequency."""
    rope_scaling: RopeScalingConfig | None = None
    """RoPE frequency scaling (e.g. Llama 3.1's "llama3"); unset means none."""
    norm_eps: float = Field(default=1e-5, gt=0)
    """RMSNorm epsilon."""
    tie_embeddings: bool = True
    """Share the input embedding with the output head (published without `lm_head.weight`)."""
    n_experts: int = Field(default=8, gt=0)
    """MoE families: routed experts per MoE block."""
    n_experts_per_tok: int = Field(default=2, gt=0)
    """MoE families: experts each token is routed to (top-k)."""
    moe_ffn_dim: int = Field(default=64, gt=0)
    """MoE families: inner size of each expert's SwiGLU."""
    norm_topk_prob: bool = True
    """MoE families: renormalise the top-k router probabilities to sum to 1."""
    shared_expert_ffn_dim: int = Field(default=0, ge=0)
    """MoE families: inner size of a sigmoid-gated shared expert every token uses; 0 = none
    ("qwen2_moe" needs one)."""
    decoder_sparse_step: int = Field(default=1, gt=0)
    """MoE families: every n-th block is an MoE block, the others dense."""
    router_aux_loss_coef: float = Field(default=0.001, ge=0)
    """MoE families: weight of the load-balancing auxiliary loss."""
    init_std: float = Field(default=0.02, gt=0)
    """Standard deviation of the normal initialisation of weight matrices."""

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.path is not None:
            given = sorted(set(ARCHITECTURE_FIELDS) & self.model_fields_set)
            if given:
                raise ValueError(
                    f"model.path is set, so its config.json defines the architecture; "
                    f"remove {given}"
                )
        if self.attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            raise ValueError(
                'model.attn = "flash_attention_2" needs the flash-attn package, which is not '
                'installed (pip install tidal-trainer[flash-attn] on a CUDA machine); use "sdpa"'
            )
        head_dim = self.head_dim or self.dim // self.n_heads
        if self.head_dim is None and self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if head_dim % 2:
            raise ValueError(f"head dim {head_dim} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        if self.vocab_size < ByteTokenizer.vocab_size:
            raise ValueError(
                f"vocab_size {self.vocab_size} is smaller than the tokenizer's "
                f"vocabulary ({ByteTokenizer.vocab_size})"
            )
        if self.family in MOE_FAMILIES and self.n_experts_per_tok > self.n_experts:
            raise ValueError(
                f"n_experts_per_tok {self.n_experts_per_tok} exceeds n_experts {self.n_experts}"
            )
        if self.family == "qwen2_moe" and not self.shared_expert_ffn_dim:
            raise ValueError('family "qwen2_moe" needs shared_expert_ffn_dim > 0')
        return self


class OptimConfig(BaseConfig):
    lr: float = Field(default=1e-3, gt=0)
    """AdamW learning rate of policy-gradient steps."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip applied before every optimizer step."""
    sft_lr: float | None = Field(default=None, gt=0)
    """Learning rate of SFT (warm-start) steps; unset means the same as `lr`."""


class LossConfig(BaseConfig):
    """Token-level clipped importance-ratio policy gradient.

    ratio = exp(logp - behaviour_logp) per token; the surrogate is PPO's
    min(ratio·A, clip(ratio, 1 - clip_low, 1 + clip_high)·A); the loss is the token mean
    over all loss tokens of the step (across every micro-batch).
    """

    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower clip: the ratio is clipped at 1 - clip_low."""
    clip_high: float = Field(default=0.28, ge=0)
    """Upper clip: the ratio is clipped at 1 + clip_high (asymmetric, DAPO's clip-higher)."""


class TrainerConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    """The policy model, built from this config (no hub download)."""
    optim: OptimConfig = OptimConfig()
    """Optimizer settings."""
    loss: LossConfig = LossConfig()
    """Policy-gradient loss settings."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; "auto" picks CUDA when available, else CPU."""
    num_threads: int = Field(default=1, ge=1)
    """torch intra-op CPU threads (the local stack shares 2 cores among four services)."""
    publish_dir: Path | None = None
    """Folder new weight versions are written to; default `<run dir>/weights`, the same
    default as weightsync's root (it must be inside weightsync's root)."""


class TrainerRunConfig(ServiceRunConfig):
    trainer: TrainerConfig = TrainerConfig()  # type: ignore[assignment]

    @property
    def publish_dir(self) -> Path:
        return self.trainer.publish_dir or self.run.dir / "weights"
