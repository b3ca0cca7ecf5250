"""Configuration of the trainer service (`[trainer]`).

pydantic only (no torch import), so the umbrella CLI can validate a whole run config and
print `--help` instantly. The defaults are the embedded CPU run: a ~0.4M-parameter Llama
over the byte tokenizer, trained in fp32 with AdamW on one thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tidal.common.config import BaseConfig
from tidal.common.sections import ServiceRunConfig
from tidal.common.tokenizer import ByteTokenizer


class ModelConfig(BaseConfig):
    family: Literal["llama"] = "llama"
    """Model family; "llama" (dense GQA decoder with RoPE, RMSNorm and SwiGLU)."""
    dim: int = Field(default=128, gt=0)
    """Hidden size."""
    n_layers: int = Field(default=2, gt=0)
    """Number of decoder blocks."""
    n_heads: int = Field(default=4, gt=0)
    """Attention (query) heads; must divide `dim`."""
    n_kv_heads: int = Field(default=2, gt=0)
    """Key/value heads (grouped-query attention); must divide `n_heads`."""
    ffn_dim: int = Field(default=352, gt=0)
    """Inner size of the SwiGLU feed-forward block."""
    vocab_size: int = Field(default=264, gt=0)
    """Embedding rows; at least the tokenizer's vocabulary (259 for "byte"), padded up is fine."""
    max_seq_len: int = Field(default=128, gt=0)
    """Longest sample (prompt + completion) in tokens; sizes the RoPE tables."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base frequency."""
    tie_embeddings: bool = True
    """Share the input embedding with the output head (published without `lm_head.weight`)."""
    init_std: float = Field(default=0.02, gt=0)
    """Standard deviation of the normal initialisation of weight matrices."""

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head dim {self.dim // self.n_heads} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        if self.vocab_size < ByteTokenizer.vocab_size:
            raise ValueError(
                f"vocab_size {self.vocab_size} is smaller than the tokenizer's "
                f"vocabulary ({ByteTokenizer.vocab_size})"
            )
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
