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
from tidal.common.sections import ServiceRunConfig, SharedConfig
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


class ScheduleConfig(BaseConfig):
    """Learning rate at step n (1-indexed): lr · factor(n - 1), linear warmup then decay."""

    warmup_steps: int = Field(default=0, ge=0)
    """Steps whose learning rate ramps linearly from lr/warmup_steps up to lr."""
    decay: Literal["constant", "cosine", "linear"] = "constant"
    """Shape after warmup: constant, cosine or linear decay to lr · min_lr_ratio."""
    decay_steps: int | None = Field(default=None, gt=0)
    """Steps after warmup over which cosine/linear decay reaches its floor (required for them)."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Floor of the decay, as a fraction of lr."""

    @model_validator(mode="after")
    def _check_decay(self) -> ScheduleConfig:
        if self.decay != "constant" and self.decay_steps is None:
            raise ValueError(f"decay {self.decay!r} needs decay_steps")
        return self


class OptimConfig(BaseConfig):
    type: Literal["adamw", "sgd"] = "adamw"
    """Optimizer: AdamW, or plain SGD (with optional momentum)."""
    lr: float = Field(default=1e-3, gt=0)
    """Peak learning rate of policy-gradient steps."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    momentum: float = Field(default=0.0, ge=0, lt=1)
    """SGD momentum (0 = plain SGD)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled (AdamW) or L2 (SGD) weight decay; never applied to 1-D params (norms)."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip applied before every optimizer step."""
    sft_lr: float | None = Field(default=None, gt=0)
    """Peak learning rate of SFT (warm-start) steps; unset means the same as `lr`."""
    schedule: ScheduleConfig = ScheduleConfig()
    """Warmup and decay of the learning rate over steps."""


class TrustRegionConfig(BaseConfig):
    """Off-policy guard: tokens outside the region contribute no policy-gradient term."""

    ratio_low: float | None = Field(default=None, gt=0)
    """Mask tokens whose ratio π/μ is below this (unset: no lower bound)."""
    ratio_high: float | None = Field(default=None, gt=0)
    """Mask tokens whose ratio π/μ is above this (unset: no upper bound)."""
    max_prob_diff: float | None = Field(default=None, gt=0, le=1)
    """Mask tokens whose probability differs from the behaviour one by more than this."""

    @model_validator(mode="after")
    def _check_order(self) -> TrustRegionConfig:
        low, high = self.ratio_low, self.ratio_high
        if low is not None and high is not None and low >= high:
            raise ValueError(f"ratio_low {low} must be below ratio_high {high}")
        return self


class KLConfig(BaseConfig):
    coef: float = Field(default=0.0, ge=0)
    """Weight of KL(policy ‖ reference) in the loss; 0 disables it (and the reference model)."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token estimator, with d = log π/π_ref: k1 = d, k2 = d²/2, k3 = e^(-d) + d - 1."""


class LossConfig(BaseConfig):
    """Clipped importance-ratio policy gradient, with optional KL and entropy terms.

    ratio = exp(logp - behaviour_logp) per token (or GSPO's per-sequence geometric mean);
    the surrogate is PPO's min(ratio·A, clip(ratio, 1 - clip_low, 1 + clip_high)·A),
    summed with the weights of `norm` over all loss tokens of the step.
    """

    ratio_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token, or per sequence (GSPO: exp of the mean token log-ratio)."""
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower clip: the ratio is clipped at 1 - clip_low."""
    clip_high: float = Field(default=0.28, ge=0)
    """Upper clip: the ratio is clipped at 1 + clip_high (asymmetric, DAPO's clip-higher)."""
    trust_region: TrustRegionConfig = TrustRegionConfig()
    """Masking of tokens that left the trust region (all bounds unset: no masking)."""
    norm: Literal["token", "sequence", "constant"] = "token"
    """Normalisation: token mean over the step, mean of per-sequence means, or / norm_constant."""
    norm_constant: float | None = Field(default=None, gt=0)
    """Divisor of the "constant" normalisation (Dr.GRPO), e.g. the generation token budget."""
    kl: KLConfig = KLConfig()
    """KL penalty to the frozen initial model."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Entropy bonus: coef · (normalised) entropy is subtracted from the loss."""

    @model_validator(mode="after")
    def _check_norm(self) -> LossConfig:
        if self.norm == "constant" and self.norm_constant is None:
            raise ValueError('norm "constant" needs norm_constant')
        return self


class CheckpointConfig(BaseConfig):
    dir: Path | None = None
    """Checkpoint folder; default `<run dir>/checkpoints`."""
    interval: int = Field(default=0, ge=0)
    """Save every this many steps (0: never, except the end of `tidal sft`)."""
    keep_last: int = Field(default=2, ge=1)
    """Complete checkpoints kept; older ones are deleted after a newer one is complete."""


class TrainerConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    """The policy model, built from this config (no hub download)."""
    optim: OptimConfig = OptimConfig()
    """Optimizer settings."""
    loss: LossConfig = LossConfig()
    """Policy-gradient loss settings."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute dtype: bf16 runs the forward under autocast; weights and optimizer stay fp32."""
    ckpt: CheckpointConfig = CheckpointConfig()
    """Checkpoints of model, optimizer, schedule, RNG and step."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; "auto" picks CUDA when available, else CPU."""
    num_threads: int = Field(default=1, ge=1)
    """torch intra-op CPU threads (the local stack shares 2 cores among four services)."""
    publish_dir: Path | None = None
    """Folder new weight versions are written to; default `<run dir>/weights`, the same
    default as weightsync's root (it must be inside weightsync's root)."""


class TrainerRunConfig(ServiceRunConfig):
    trainer: TrainerConfig = TrainerConfig()  # type: ignore[assignment]
    resume: bool = False
    """Restore the newest complete checkpoint in `trainer.ckpt.dir` and continue (`--resume`)."""

    @property
    def checkpoint_dir(self) -> Path:
        return self.trainer.ckpt.dir or self.run.dir / "checkpoints"

    @property
    def publish_dir(self) -> Path:
        return self.trainer.publish_dir or self.run.dir / "weights"


class SftDataConfig(BaseConfig):
    path: Path | None = None
    """Prompt/completion records: a .jsonl file (one JSON object per line) or .parquet."""
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    """File format; "auto" decides by the suffix (.parquet/.pq, else JSONL)."""
    prompt_key: str = "prompt"
    """Field holding the prompt text (its tokens are masked out of the loss)."""
    completion_key: str = "completion"
    """Field holding the completion text (trained on, followed by EOS)."""


class SftConfig(BaseConfig):
    data: SftDataConfig = SftDataConfig()
    """Where the training records come from."""
    steps: int = Field(default=100, gt=0)
    """Optimizer steps to train (counted from step 1, including resumed ones)."""
    batch_size: int = Field(default=8, gt=0)
    """Samples per step; the data is reshuffled each epoch."""
    micro_batch_tokens: int = Field(default=1024, gt=0)
    """Token budget of one packed micro-batch (at least the longest sample)."""


class SftRunConfig(SharedConfig):
    """`tidal sft @ cfg.toml`: supervised fine-tuning with the trainer's model and losses."""

    trainer: TrainerConfig = TrainerConfig()
    """Model, optimizer, precision and checkpoint settings (the same section as RL runs)."""
    sft: SftConfig = SftConfig()
    """Data and length of the SFT run."""
    resume: bool = False
    """Continue from the newest complete checkpoint in `trainer.ckpt.dir` (`--resume`)."""

    @property
    def checkpoint_dir(self) -> Path:
        return self.trainer.ckpt.dir or self.run.dir / "checkpoints"
