"""Peak memory per rank of one training step, itemised, from the config alone.

Model states follow the ZeRO paper's accounting (`zero_model_states`, held to its
published example); the trainer keeps fp32 weights and gradients and FSDP shards all
three (stage 3). Activations are counted tensor by tensor from what our blocks save for
backward, minus what checkpointing, offloading or LoRA leave unsaved. The peak is model
states plus the larger of the backward phase and the update phase, plus a fragmentation
margin. docs/memory-planner.md walks through every term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tidal.models.args import DecoderArgs
from tidal.trainer.memory.precision import AUTO_BF16_MIN_PARAMS
from tidal.trainer.memory_planner.levers import Levers, chunk_tokens
from tidal.trainer.memory_planner.model_size import ParamCounts, param_counts

GB = 10**9  # the ZeRO paper's "GB" is decimal
FRAGMENTATION = {"cuda": 0.08, "cpu": 0.02}
LOGITS_LIVE = 4  # [tokens, vocab] fp32 tensors alive at the head's backward peak
CHUNK_LIVE = 5  # [chunk, vocab] fp32 tensors alive in the chunked head's backward
# Bytes per saved element under bf16 autocast. The MLP's tensors are matmul outputs (bf16);
# the rest of a block (the residual stream, the norms, RoPE's q and k) stays fp32 and its
# matmuls save bf16 copies of some of their fp32 inputs beside them, so it costs more than
# 4 bytes (fitted to what `saved_tensors_hooks` sees in a Llama block at 576 wide, 2048
# tokens of 100-token samples: docs/memory-planner.md). The weights' own bf16 copies are
# counted apart (`_autocast_copies`).
AUTOCAST_MLP_BYTES, AUTOCAST_OTHER_BYTES = 2, 4.5


@dataclass(frozen=True)
class ModelStates:
    params: float
    grads: float
    optim: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optim


def zero_model_states(
    num_params: float,
    dp: int,
    *,
    stage: Literal[0, 1, 2, 3],
    param_bytes: float = 2,
    grad_bytes: float = 2,
    optim_bytes: float = 12,
) -> ModelStates:
    """Per-device model-state bytes under ZeRO stage 0-3 (defaults: mixed-precision Adam)."""
    return ModelStates(
        params=param_bytes * num_params / (dp if stage >= 3 else 1),
        grads=grad_bytes * num_params / (dp if stage >= 2 else 1),
        optim=optim_bytes * num_params / (dp if stage >= 1 else 1),
    )


@dataclass(frozen=True)
class Workload:
    tokens: int  # per micro-batch
    world_size: int = 1
    device: Literal["cpu", "cuda"] = "cpu"
    precision: Literal["fp32", "bf16"] = "fp32"  # the step's compute: `resolve_precision`


def resolve_precision(
    precision: Literal["fp32", "bf16", "auto"], device: Literal["cpu", "cuda"], params: int
) -> Literal["fp32", "bf16"]:
    """`trainer.precision` as the trainer resolves it: "auto" is bf16 on CUDA, and on a CPU
    with native bf16 (this machine's, probed) for models of at least `AUTO_BF16_MIN_PARAMS`."""
    if precision != "auto":
        return precision
    if device == "cuda":
        return "bf16"
    from tidal.models.cpu_features import bf16_support  # imports torch to probe

    return "bf16" if bf16_support().native and params >= AUTO_BF16_MIN_PARAMS else "fp32"


@dataclass(frozen=True)
class MemoryPlan:
    items: dict[str, float]  # bytes per rank, in the order they are reported
    notes: list[str]

    @property
    def peak(self) -> float:
        return sum(self.items.values())


def _layer_elements(a: DecoderArgs, layer: int) -> dict[str, int]:
    """Elements per token saved for backward by one block, by what recomputes them."""
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    if a.is_moe_layer(layer):  # routed inputs/outputs of top-k experts, plus a shared one
        inner = a.n_experts_per_tok * (2 * a.dim + 4 * a.moe_ffn_dim) + a.n_experts
        inner += 4 * a.shared_expert_ffn_dim
    else:
        inner = 4 * a.ffn_dim  # gate, silu(gate), up, silu(gate)·up
    return {
        "input": a.dim,  # the block input (what a checkpoint keeps)
        "norm": 4 * a.dim,  # each RMSNorm saves x·rstd and its output feeds a matmul
        "attention": 2 * q + 2 * kv + (2 * (q + kv) if a.qk_norm else 0),  # q, k, v, out
        "attn_proj": q + a.dim,  # o_proj's input; the residual sum feeding the second norm
        "mlp": inner,
    }


def _lora_unsaved(a: DecoderArgs, levers: Levers, layer: int) -> int:
    """Elements per token a LoRA run does not save: the inputs of frozen projections that
    no adapter reads (a frozen weight's input gradient needs the weight, not the input)."""
    if levers.lora_rank is None or a.is_moe_layer(layer):
        return 0
    targets = set(levers.lora_targets)
    unsaved = 0 if targets & {"q_proj", "k_proj", "v_proj"} else a.dim  # first norm's output
    unsaved += 0 if targets & {"gate_proj", "up_proj"} else a.dim  # second norm's output
    unsaved += 0 if "down_proj" in targets else a.ffn_dim  # silu(gate)·up
    return unsaved


def _layer_bytes(a: DecoderArgs, layer: int, precision: str) -> dict[str, float]:
    """Bytes per token saved for backward by one block, by what recomputes them."""
    parts = _layer_elements(a, layer)
    if precision != "bf16":
        return {k: 4.0 * v for k, v in parts.items()}
    return {
        k: float(v * (AUTOCAST_MLP_BYTES if k == "mlp" else AUTOCAST_OTHER_BYTES))
        for k, v in parts.items()
    }


def _activations(a: DecoderArgs, levers: Levers, w: Workload) -> tuple[float, float]:
    """(saved activation bytes of all blocks, extra bytes while one block recomputes)."""
    width = 2 if w.precision == "bf16" else 4  # what LoRA leaves unsaved: bf16 matmul inputs
    # Under autocast, LoRA's frozen RMSNorm weights also leave each norm's fp32 normalized
    # input unsaved (measured in bf16; the fp32 rule is the one its measured cases hold).
    frozen_norms = 2 * a.dim * 4 if w.precision == "bf16" and levers.lora_rank else 0
    saved, recompute = 0.0, 0.0
    for i in range(a.n_layers):
        parts = _layer_bytes(a, i, w.precision)
        parts["mlp"] -= _lora_unsaved(a, levers, i) * width + frozen_norms
        full = sum(parts.values())
        if levers.ac_mode == "full" and i % levers.ac_freq == 0:
            kept = parts["input"]
            recompute = max(recompute, full - kept)
        elif levers.ac_mode == "selective":
            dropped = sum(parts[t] for t in levers.ac_targets if t in parts)
            kept = full - dropped
            recompute = max(recompute, dropped)
        else:
            kept = full
        saved += kept * w.tokens
    recompute *= w.tokens
    if levers.ac_offloading and w.device == "cuda":
        largest = max(sum(_layer_bytes(a, i, w.precision).values()) for i in range(a.n_layers))
        per_tensor = largest * w.tokens / 8  # a block saves ~8 tensors
        saved = min(saved, levers.max_inflight_activations * per_tensor)
    return saved, recompute


def activation_per_layer(a: DecoderArgs, w: Workload) -> dict[str, float]:
    """Saved activation bytes of the average block under each checkpointing/offload choice."""
    choices = {
        "no checkpointing": Levers(),
        "selective (norm, mlp)": Levers(ac_mode="selective"),
        "full checkpointing": Levers(ac_mode="full"),
        "offloaded": Levers(ac_offloading=True),
    }
    return {
        name: _activations(a, levers, w)[0] / a.n_layers
        for name, levers in choices.items()
        if name != "offloaded" or w.device == "cuda"
    }


def _trainable(a: DecoderArgs, counts: ParamCounts, levers: Levers) -> float:
    if levers.lora_rank is None:
        return counts.total
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    shapes = {
        "q_proj": (a.dim, q),
        "k_proj": (a.dim, kv),
        "v_proj": (a.dim, kv),
        "o_proj": (q, a.dim),
        "gate_proj": (a.dim, a.ffn_dim),
        "up_proj": (a.dim, a.ffn_dim),
        "down_proj": (a.ffn_dim, a.dim),
    }
    per_layer = sum(sum(shapes[t]) for t in levers.lora_targets if t in shapes)
    return float(levers.lora_rank * per_layer * a.n_layers)


def _autocast_copies(a: DecoderArgs, counts: ParamCounts, levers: Levers, w: Workload) -> float:
    """bf16 copies of the matmul weights that autocast makes and the backward keeps (a
    weight's input gradient needs it), frozen ones too; a checkpointed block recasts its own."""
    if w.precision != "bf16":
        return 0.0
    kept = [
        n - 2 * a.dim  # the block's two norms are not cast
        for i, n in enumerate(counts.per_layer)
        if not (levers.ac_mode == "full" and i % levers.ac_freq == 0)
    ]
    return 2.0 * (sum(kept) + (counts.lm_head or counts.embedding)) / w.world_size


def plan_memory(a: DecoderArgs, levers: Levers, w: Workload) -> MemoryPlan:
    """Itemised peak bytes per rank for one training step of `a` with `levers` on `w`."""
    counts = param_counts(a)
    total, trainable = float(counts.total), _trainable(a, counts, levers)
    shard = w.world_size
    optim_per_param = {"adamw": 8, "sgd": 4 if levers.momentum > 0 else 0}[levers.optimizer]
    notes: list[str] = []
    params, grads = 4 * total / shard, 4 * trainable / shard
    optim = optim_per_param * trainable / shard
    if levers.fsdp_cpu_offload:
        if w.device == "cuda":
            notes.append("FSDP CPU offload: parameters, gradients and optimizer states on host")
            largest_block = 4 * max(counts.per_layer)
            params, grads, optim = 2 * largest_block, largest_block, 0.0
    elif levers.optim_offload == "disk" or (levers.optim_offload == "cpu" and w.device == "cuda"):
        pool = levers.optim_buffer_mb * 2**20
        notes.append(f"optimizer states off the device ({levers.optim_offload}), pool {pool:.0f} B")
        optim = min(optim, pool)
    saved, recompute = _activations(a, levers, w)
    chunk = chunk_tokens(levers, a.vocab_size, w.tokens)
    if chunk is None:
        logits = LOGITS_LIVE * w.tokens * a.vocab_size * 4
    else:  # per chunk, plus the (N,) log-sum-exp, entropy and logprobs it keeps
        logits = CHUNK_LIVE * chunk * a.vocab_size * 4 + 3 * w.tokens * 4
    head_grad = 4 * (counts.lm_head or counts.embedding) * (trainable == total) / shard
    width = 2 if w.precision == "bf16" else 4
    final_norm = 3 * a.dim * w.tokens * width
    # The head's backward ends (its logits freed) before the first block recomputes, so
    # the two are not alive together; a block's backward also holds activation gradients.
    block_backward = recompute + (2 * a.dim + 2 * a.ffn_dim) * w.tokens * width
    copies = _autocast_copies(a, counts, levers, w)
    backward_start = saved + copies + head_grad + max(logits + final_norm, block_backward)
    largest_param = 4 * max(counts.embedding, max(counts.per_layer) // 4)
    update = grads + (2 * largest_param if optim_per_param else 0)
    comm = 0.0
    if shard > 1:  # FSDP: all-gather current + prefetched block, reduce-scatter one block
        comm = 3 * 4 * max(counts.per_layer)
    if backward_start > update:
        notes.append("peak at the start of backward (activations and logits alive)")
        if logits + final_norm >= block_backward:
            phase = {"gradients": head_grad, "activations": saved, "bf16 weight copies": copies}
            phase |= {"logits": logits + final_norm, "optimizer temporaries": 0.0}
        else:  # peak while a checkpointed block recomputes
            phase = {"gradients": head_grad, "activations": saved + block_backward}
            phase |= {"bf16 weight copies": copies, "logits": 0.0, "optimizer temporaries": 0.0}
    else:
        notes.append("peak in the optimizer update (all gradients alive)")
        phase = {"gradients": grads, "activations": 0.0, "bf16 weight copies": 0.0}
        phase["logits"] = 0.0
        phase["optimizer temporaries"] = update - grads
    items = {"parameters": params, "optimizer states": optim, **phase}
    items["communication buffers"] = comm
    items["fragmentation margin"] = FRAGMENTATION[w.device] * sum(items.values())
    per_layer = (saved + recompute) / max(1, a.n_layers)
    notes.append(f"activations: {per_layer / 2**20:.1f} MiB per layer on average")
    if trainable < total:
        notes.append(f"LoRA: {trainable:.3g} trainable of {total:.3g} parameters")
    return MemoryPlan(items=items, notes=notes)
