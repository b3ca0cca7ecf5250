"""Configuration of the trainer service (`[trainer]`).

pydantic only (no torch import), so the umbrella CLI can validate a whole run config and
print `--help` instantly. The defaults are the embedded CPU run: a ~0.4M-parameter Llama
over the byte tokenizer, trained in fp32 with AdamW on one thread.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig
from tidal.common.config.schema import FIRST
from tidal.common.config.shared import ServiceRunConfig
from tidal.common.errors import ConfigError
from tidal.models.args import DecoderArgs, RopeScaling
from tidal.models.attention_kind import FLASH_ATTN_INSTALL, PackedKind
from tidal.models.families import FamilyName, family_of
from tidal.models.hf_config import read_config
from tidal.trainer.memory.chunk_size import ChunkSize
from tidal.trainer.memory_config import (
    ActivationCheckpointConfig,
    ActivationOffloadingConfig,
    CompileConfig,
    LoRAConfig,
    TruncationConfig,
    check_lever_combination,
)
from tidal.trainer.model_folder import (
    ARCHITECTURE_FIELDS,
    check_tokenizer_fits,
    conflicts,
    folder_architecture,
)
from tidal.trainer.parallel_config import ParallelConfig, check_parallel


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
    family: FamilyName = "llama"
    """Model family: "llama" (GQA, RoPE, RMSNorm, SwiGLU), "qwen2" (+ q/k/v biases), "qwen3"
    (+ QK-norm), "qwen3_moe" (Qwen3 with mixture-of-experts blocks), "qwen2_moe" (Qwen2
    attention, experts plus a shared expert)."""
    path: Annotated[Path | None, FIRST] = None
    """Local Hugging Face model folder (config.json + model.safetensors, or shards with
    model.safetensors.index.json) to start from. Its config.json then defines the
    architecture: the fields above and below (family, dim, layers, heads, vocab, ...) are
    filled in from it, and setting one to another value is an error."""
    impl: Literal["auto", "custom", "hf"] = "auto"
    """Which implementation runs the model: "custom" (ours), "hf" (transformers'
    AutoModelForCausalLM, needs `transformers`), "auto" (ours where the architecture is
    supported, else transformers')."""
    attn: PackedKind = "sdpa"
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
    """MoE families: renormalize the top-k router probabilities to sum to 1."""
    shared_expert_ffn_dim: int = Field(default=0, ge=0)
    """MoE families: inner size of a sigmoid-gated shared expert every token uses; 0 = none
    ("qwen2_moe" needs one)."""
    decoder_sparse_step: int = Field(default=1, gt=0)
    """MoE families: every n-th block is an MoE block, the others dense."""
    router_aux_loss_coef: float = Field(default=0.001, ge=0)
    """MoE families: weight of the load-balancing auxiliary loss."""
    init_std: float = Field(default=0.02, gt=0)
    """Standard deviation of the normal initialization of weight matrices."""
    ac: ActivationCheckpointConfig | None = None
    """Activation checkpointing (memory lever); unset = off."""
    ac_offloading: ActivationOffloadingConfig | None = None
    """Activation offloading to host memory (memory lever); unset = off."""
    fused_lm_head_token_chunk_size: ChunkSize = "disabled"
    """Chunked LM head: logprobs and entropy computed this many tokens at a time without
    materializing [tokens, vocab] logits; "auto" sizes chunks to ~64 MiB of fp32 logits."""
    lora: LoRAConfig | None = None
    """LoRA adapters on frozen base weights (memory lever); unset = full fine-tuning."""
    compile: CompileConfig | None = None
    """torch.compile per decoder block; unset = eager."""
    truncation: TruncationConfig = TruncationConfig()
    """Prompt / completion / total length caps applied to trained samples (unset = none)."""
    fsdp_cpu_offload: bool = False
    """FSDP keeps parameters, gradients and optimizer states in host memory and moves each
    block's shard to the device only while it computes (needs FSDP, so trainer.world_size
    > 1: the trainer refuses it at world size 1; excludes `trainer.optim.optim_cpu_offload`,
    which it already covers)."""

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.path is not None:
            self._take_folder_architecture(self.path)
        if self.attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            raise ValueError(
                'model.attn = "flash_attention_2" needs the flash-attn package, which is not '
                f'installed ({FLASH_ATTN_INSTALL}); use "sdpa"'
            )
        if self.path is None:
            self.decoder_args()  # DecoderArgs' shape rules: head dim, head groups, top-k
        if self.family == "qwen2_moe" and not self.shared_expert_ffn_dim:
            raise ValueError('family "qwen2_moe" needs shared_expert_ffn_dim > 0')
        check_lever_combination(self)
        return self

    def decoder_args(self) -> DecoderArgs:
        """The architecture this section builds: its folder's config.json when `path` is
        set (with keys this section has no field for, e.g. `mlp_only_layers`)."""
        if self.path is not None:
            return DecoderArgs.from_hf_config(read_config(self.path))
        family = family_of(self.family)
        moe = family.moe
        scaling = self.rope_scaling
        return DecoderArgs(
            vocab_size=self.vocab_size,
            dim=self.dim,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            ffn_dim=self.ffn_dim,
            max_seq_len=self.max_seq_len,
            rope_theta=self.rope_theta,
            norm_eps=self.norm_eps,
            tie_embeddings=self.tie_embeddings,
            family=self.family,
            head_dim=self.head_dim or 0,
            rope_scaling=RopeScaling(**scaling.model_dump()) if scaling is not None else None,
            attention_bias=family.attention_bias,
            qk_norm=family.qk_norm,
            n_experts=self.n_experts if moe else 0,
            n_experts_per_tok=self.n_experts_per_tok if moe else 0,
            moe_ffn_dim=self.moe_ffn_dim if moe else 0,
            norm_topk_prob=self.norm_topk_prob,
            shared_expert_ffn_dim=self.shared_expert_ffn_dim if moe else 0,
            decoder_sparse_step=self.decoder_sparse_step,
            router_aux_loss_coef=self.router_aux_loss_coef,
        )

    def _take_folder_architecture(self, path: Path) -> None:
        """Fill the architecture fields in from the folder's config.json (model_folder.py);
        an explicitly set field must already hold the folder's value."""
        folder = folder_architecture(path)
        if folder is None:  # an architecture only transformers runs: nothing to map
            return
        given = {k: getattr(self, k) for k in ARCHITECTURE_FIELDS if k in self.model_fields_set}
        if isinstance(given.get("rope_scaling"), RopeScalingConfig):
            given["rope_scaling"] = given["rope_scaling"].model_dump()
        defaults = {k: type(self).model_fields[k].get_default() for k in ARCHITECTURE_FIELDS}
        problems = conflicts(given, folder, defaults)
        if problems:
            raise ValueError("; ".join(problems))
        for key, value in folder.items():
            if key == "rope_scaling" and value is not None:
                value = RopeScalingConfig.model_validate(value)
            setattr(self, key, value)


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
    lr: Annotated[float, FIRST] = Field(default=1e-3, gt=0)
    """Peak learning rate of policy-gradient steps."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    momentum: float = Field(default=0.0, ge=0, lt=1)
    """SGD momentum (0 = plain SGD)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled (AdamW) or L2 (SGD) weight decay; never applied to 1-D params (norms)."""
    fused_adamw: bool = True
    """Use torch's fused AdamW kernel where it applies (every parameter a plain tensor on
    one CPU/CUDA device, i.e. one process; one kernel over all parameters). Sharded
    parameters always use torch's default kernel. false: the default kernel everywhere,
    which is what makes one process bitwise comparable with a sharded run (the fused
    kernel rounds differently, ~1 ulp per step)."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip applied before every optimizer step."""
    sft_lr: float | None = Field(default=None, gt=0)
    """Peak learning rate of SFT (warm-start) steps; unset means the same as `lr`."""
    schedule: ScheduleConfig = ScheduleConfig()
    """Warmup and decay of the learning rate over steps."""
    optim_cpu_offload: bool = False
    """Keep optimizer states in host memory between steps; the update streams them to the
    device slice by slice through a small buffer pool (saves device memory on GPU)."""
    optim_offload: Literal["none", "disk"] = "none"
    """"disk": optimizer states live in memory-mapped files under `optim_offload_dir`, updated
    slice by slice through a small reused buffer pool, so host memory stays bounded."""
    optim_offload_dir: Path | None = None
    """Folder of the memory-mapped state files of `optim_offload = "disk"`; default a
    temporary folder removed at exit."""
    optim_offload_buffer_mb: float = Field(default=64.0, gt=0)
    """Size of the reused buffer pool of an offloaded update (all state kinds together)."""

    @model_validator(mode="after")
    def _check_offload(self) -> OptimConfig:
        if self.optim_cpu_offload and self.optim_offload == "disk":
            raise ValueError(
                'optim.optim_cpu_offload and optim.optim_offload = "disk" are alternatives '
                "(host memory or memory-mapped files); set one"
            )
        return self


class TrustRegionConfig(BaseConfig):
    """Masked importance sampling (MIS): a token, or a whole sequence, whose behaviour
    weight w = π/μ leaves a band contributes no policy-gradient term (docs/training.md,
    "Off-policy correction"). Every bound unset: no masking."""

    ratio_low: float | None = Field(default=None, gt=0)
    """Token MIS: mask tokens whose weight w_t is below this (unset: no lower bound)."""
    ratio_high: float | None = Field(default=None, gt=0)
    """Token MIS: mask tokens whose weight w_t is above this (unset: no upper bound)."""
    sequence_ratio_low: float | None = Field(default=None, gt=0)
    """Sequence MIS: mask a whole sample whose weight Π_t w_t is below this."""
    sequence_ratio_high: float | None = Field(default=None, gt=0)
    """Sequence MIS: mask a whole sample whose weight Π_t w_t is above this."""
    geo_ratio_low: float | None = Field(default=None, gt=0)
    """Geometric-mean masking: mask a whole sample whose exp(mean_t log w_t) is below this."""
    geo_ratio_high: float | None = Field(default=None, gt=0)
    """Geometric-mean masking: mask a whole sample whose exp(mean_t log w_t) is above this."""
    max_prob_diff: float | None = Field(default=None, gt=0, le=1)
    """Mask tokens whose probability differs from the behaviour one by more than this."""

    @model_validator(mode="after")
    def _check_order(self) -> TrustRegionConfig:
        for name in ("ratio", "sequence_ratio", "geo_ratio"):
            low, high = getattr(self, f"{name}_low"), getattr(self, f"{name}_high")
            if low is not None and high is not None and low >= high:
                raise ValueError(f"{name}_low {low} must be below {name}_high {high}")
        return self

    @property
    def per_sequence(self) -> bool:
        """Whether a bound needs whole samples (sequence MIS or geometric-mean masking)."""
        bounds = (self.sequence_ratio_low, self.sequence_ratio_high)
        return any(b is not None for b in (*bounds, self.geo_ratio_low, self.geo_ratio_high))


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
    """Masked importance sampling of tokens or samples whose behaviour weight left a band
    (all bounds unset: no masking)."""
    objective: Literal["coupled", "decoupled"] = "coupled"
    """"coupled": the clipped ratio is π_θ/μ against the behaviour policy μ. "decoupled"
    (AReaL): the clipped ratio is π_θ/π_prox against the trainer's policy at the step's
    weights, and each term is weighted by the behaviour weight w = π_prox/μ (capped by
    `tis_cap`), so clipping bounds the update while staleness and mismatch are corrected
    by importance weights instead of being clipped away."""
    tis_cap: float | None = Field(default=None, gt=0)
    """Truncated importance sampling: the behaviour weight w = π_prox/μ of each token (of
    each sample with `ratio_level = "sequence"`) is capped at this C, min(w, C), wherever
    it enters the loss (unset: no cap)."""
    norm: Literal["token", "sequence", "constant"] = "token"
    """Normalization: token mean over the step, mean of per-sequence means, or / norm_constant."""
    norm_constant: float | None = Field(default=None, gt=0)
    """Divisor of the "constant" normalization (Dr.GRPO), e.g. the generation token budget."""
    kl: KLConfig = KLConfig()
    """KL penalty to the frozen initial model."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Entropy bonus: coef · (normalized) entropy is subtracted from the loss."""
    skip_zero_advantage: bool = True
    """Leave samples whose advantage is 0 on every loss token (a group with equal rewards)
    out of the forward and backward, where their gradient is exactly zero: policy-gradient
    steps without KL, entropy bonus or MoE router loss, and without context parallelism
    (elsewhere every sample is trained). The step's loss denominators still count them,
    so the update is unchanged; token metrics (entropy, clip and ratio means) then average
    the trained samples, and `zero_adv_skipped_samples` counts those left out."""

    @model_validator(mode="after")
    def _check_norm(self) -> LossConfig:
        if self.norm == "constant" and self.norm_constant is None:
            raise ValueError('norm "constant" needs norm_constant')
        return self


JOURNALED_INTERVAL = 20
"""`trainer.ckpt.interval`'s default where the step journal makes the steps between
checkpoints durable."""


class CheckpointConfig(BaseConfig):
    dir: Path | None = None
    """Checkpoint folder; default `<run dir>/checkpoints`."""
    interval: Annotated[int | None, FIRST] = Field(default=None, ge=0)
    """Save a full checkpoint (weights, optimizer, scheduler, RNG) every this many steps
    (0: never, except the end of `tidal sft`; an RL trainer is then not resumable).
    Unset (the default): 20 where the trainer journals its steps (`journal`, every RL
    trainer), else 1. With the journal a trainer killed at any point resumes
    (`tidal rl --resume`) losing no trained step, replaying at most `interval - 1`
    journaled steps, so there `interval` trades the checkpoint's cost for replay time
    after a crash, not durability. Without it (`journal = false`), the versions published
    after the last checkpoint are lost with a crashed trainer and `--resume`
    refuses to continue under them, hence 1 (docs/training.md, "Durability"). `tidal sft`
    has no journal: an interrupted SFT run resumes from its newest checkpoint and trains
    the steps after it again, to the same weights (its data order is in the checkpoint)."""
    journal: bool = True
    """RL: write every step's batch durably (a few KB-MB, `<checkpoint dir>/journal/`,
    rank 0 for a torchrun trainer) before its update runs, so `--resume` replays the steps
    after the newest checkpoint (bitwise the same steps on the same machine and thread
    count and ranks)."""
    keep_last: int = Field(default=2, ge=1)
    """Complete checkpoints kept; older ones are deleted after a newer one is complete."""

    def every(self, *, journaled: bool) -> int:
        """`interval`, or its default for a trainer that does (20) or does not (1) journal."""
        if self.interval is not None:
            return self.interval
        return JOURNALED_INTERVAL if journaled else 1


class TrainerConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    """The policy model, built from this config (no hub download)."""
    optim: OptimConfig = OptimConfig()
    """Optimizer settings."""
    loss: LossConfig = LossConfig()
    """Policy-gradient loss settings."""
    precision: Literal["fp32", "bf16", "auto"] = "auto"
    """Compute dtype: bf16 runs the forward under autocast; weights and optimizer stay fp32.
    "auto": bf16 where the device computes it natively (CUDA with bf16; a CPU whose oneDNN
    bf16 kernels run, e.g. AVX-512 bf16 / AMX) and the model has at least 2M parameters
    (below that autocast's casts cost more than they save), else fp32. On a CPU without
    native bf16 a bf16 step is many times slower, which "auto" never picks
    (docs/benchmarks/trainer_profile.md)."""
    publish_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """dtype of the published weight versions (checkpoints and exports keep the fp32 master
    weights). "auto": bfloat16 when the step computes in bf16 (`precision`), so inference
    gets exactly the bf16 weights the trainer's forward used, and every version moves half
    the bytes (written, verified by weightsync, read by each replica); else float32."""
    ckpt: CheckpointConfig = CheckpointConfig()
    """Checkpoints of model, optimizer, schedule, RNG and step."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; "auto" picks CUDA when available, else CPU."""
    num_threads: int = Field(default=1, ge=1)
    """torch intra-op CPU threads. 1 by default: the local stack shares 2 cores among four
    services and generation runs while the trainer trains, where a second trainer thread
    gave no steady gain and slowed generation (docs/benchmarks/trainer_profile.md);
    on a machine with cores to spare, raise it."""
    background_publish: bool = True
    """When Train answers: true, as soon as the step is trained, its checkpoint (when due)
    and weight version then written during the next step's forward and backward (whose
    update waits for them); false, once its version is published. The order is the same
    either way: journal, update, checkpoint, publish (docs/training.md, "Durability"). A
    multi-rank trainer always answers after the publish (its saves are collectives)."""
    weightsync_timeout_s: float = Field(default=300.0, gt=0)
    """How long the trainer waits for weightsync to answer, at start-up and when a publish
    finds it gone (restarting), before it stops with an error naming weightsync's address.
    Meanwhile it logs that it is waiting and keeps retrying."""
    publish_dir: Path | None = None
    """Folder new weight versions are written to; default `<run dir>/weights`, the same
    default as weightsync's root (it must be inside weightsync's root)."""
    world_size: Annotated[int, FIRST] = Field(default=1, ge=1)
    """Trainer processes on this node; > 1 makes `tidal trainer` start itself under
    torchrun (rank 0 serves gRPC). See docs/distributed.md."""
    parallel: ParallelConfig = ParallelConfig()
    """How the world_size ranks split the work (FSDP/HSDP, CP, EP)."""
    max_tokens_per_step: int = Field(default=1 << 20, gt=0)
    """Most tokens (all micro-batches together) one Train request may carry; a larger
    step is refused INVALID_ARGUMENT from the request's shapes, before any tensor is
    decoded (docs/operations.md#limits)."""
    max_step_bytes: int = Field(default=256 << 20, gt=0)
    """Largest serialized request a TrainStream may carry (its declared `total_bytes`),
    refused RESOURCE_EXHAUSTED before a chunk is read: the trainer holds a step's bytes in
    memory until the whole request has arrived. A step of `max_tokens_per_step` tokens
    takes about 24 bytes a token (six 4-byte tensors), so keep it above 24 times that."""

    @model_validator(mode="after")
    def _check_parallel(self) -> TrainerConfig:
        try:
            check_parallel(self.world_size, self.parallel, self.model, self.loss)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _check_offload_levers(self) -> TrainerConfig:
        if self.model.fsdp_cpu_offload and (
            self.optim.optim_cpu_offload or self.optim.optim_offload != "none"
        ):
            raise ValueError(
                "trainer.model.fsdp_cpu_offload and trainer.optim.optim_cpu_offload / "
                "optim_offload cannot combine: FSDP CPU offload already keeps the optimizer "
                "states (with parameters and gradients) in host memory; set only one"
            )
        return self


class TrainerRunConfig(ServiceRunConfig):
    trainer: TrainerConfig = TrainerConfig()  # type: ignore[assignment]
    resume: bool = False
    """Restore the newest complete checkpoint in `trainer.ckpt.dir` and continue (`--resume`)."""

    @model_validator(mode="after")
    def _check_vocab(self) -> TrainerRunConfig:
        check_tokenizer_fits(self.run.tokenizer, self.model_folder(), self.trainer.model.vocab_size)
        return self

    @property
    def checkpoint_dir(self) -> Path:
        return self.trainer.ckpt.dir or self.run.dir / "checkpoints"

    @property
    def publish_dir(self) -> Path:
        return self.trainer.publish_dir or self.run.dir / "weights"


class SftDataConfig(BaseConfig):
    path: Annotated[Path | None, FIRST] = None
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
    steps: Annotated[int, FIRST] = Field(default=100, gt=0)
    """Optimizer steps to train (counted from step 1, including resumed ones)."""
    batch_size: int = Field(default=8, gt=0)
    """Samples per step; the data is reshuffled each epoch."""
    micro_batch_tokens: int = Field(default=1024, gt=0)
    """Token budget of one packed micro-batch (at least the longest sample)."""


class SftRunConfig(TrainerRunConfig):
    """`tidal sft @ cfg.toml`: supervised fine-tuning with the trainer's model and losses
    (the same `[trainer]` section, and run file, as RL runs)."""

    sft: SftConfig = SftConfig()  # type: ignore[assignment]
    """Data and length of the SFT run."""
