"""The `Trainer`: one optimizer step over a step's packed micro-batches.

Reads top to bottom: truncate, count the step's loss tokens, forward and backward every
micro-batch (each loss already weighted by step-level counts, so packing never changes
the result), clip, step. fp32 master weights always; bf16 runs the forward under
autocast. Ranks differ only through the `RankContext` (ranks.py). A non-finite gradient
norm skips the update instead of writing NaNs. Synchronous and gRPC-free: the service
runs it on a worker thread. The optimizer is built on first use (its first import is slow).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from tidal.batch.tensors import MicroBatchData, prediction_index, segment_ids
from tidal.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from tidal.models.hf_checkpoint import publishable_state_dict
from tidal.models.lora import adapter_state_dict
from tidal.trainer.config import TrainerConfig
from tidal.trainer.loss import TokenInputs, rl_loss, sft_loss, token_entropy
from tidal.trainer.loss_normalization import StepCounts, step_counts, token_weights
from tidal.trainer.memory.activation_offload import activation_offloading
from tidal.trainer.memory.chunk_size import resolve_chunk_size
from tidal.trainer.memory.lm_head import chunked_logprobs_entropy
from tidal.trainer.memory.lora import adapter_config
from tidal.trainer.memory.precision import resolve_precision, warn_if_bf16_is_slow
from tidal.trainer.memory.truncation import truncate_micro_batch, truncation_enabled
from tidal.trainer.memory_config import check_levers_at_start
from tidal.trainer.model_factory import build_model
from tidal.trainer.model_levers import apply_model_levers
from tidal.trainer.off_policy import finish_metrics, token_staleness
from tidal.trainer.optim import build_optimizer, build_scheduler, lr_factor
from tidal.trainer.ranks import RankContext, SingleProcess
from tidal.trainer.router_loss import router_terms
from tidal.trainer.service_trainer import LossKind
from tidal.trainer.shared_prompts import check_shared_prompts
from tidal.trainer.zero_advantage import skip_is_exact, trained_batches

log = logging.getLogger(__name__)

ONE_PROCESS = SingleProcess()


class StepAbandoned(Unavailable):
    """The step was stopped at a micro-batch boundary (shutdown); nothing was committed."""


class Trainer:
    def __init__(
        self,
        config: TrainerConfig,
        *,
        seed: int,
        device: torch.device,
        ranks: RankContext = ONE_PROCESS,
    ) -> None:
        self.config = config
        self.device = device
        self.ranks = ranks
        check_levers_at_start(config.model, sharded=ranks.shards_model)
        warn_if_bf16_is_slow(config.precision, config.parallel.param_dtype, device)
        # Order: LoRA → activation checkpointing → compile (the levers), then sharding.
        levered = apply_model_levers(
            build_model(config.model, seed=seed, device=device), config.model, seed=seed
        )
        params = sum(p.numel() for p in levered.parameters())
        self.bf16 = resolve_precision(config.precision, device, params)
        self.publish_dtype = (
            torch.bfloat16
            if config.publish_dtype == "bfloat16" or (config.publish_dtype == "auto" and self.bf16)
            else torch.float32
        )
        self.model = ranks.parallelize(levered)
        # Our models take a replacement LM head (the rows to score, chunking); transformers' do not.
        self._takes_head = "head" in inspect.signature(levered.forward).parameters
        self.lm_head_chunk = resolve_chunk_size(
            config.model.fused_lm_head_token_chunk_size, config.model.vocab_size
        )
        self.reference: torch.nn.Module | None = None
        if config.loss.kl.coef > 0:
            self.reference = build_model(config.model, seed=seed, device=device)
            self.reference.requires_grad_(False).eval()
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA
        self._optim_lock = threading.Lock()
        self._optim: tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler] | None
        self._optim = None  # built on first use (`build_optimizer_now`)
        self.trained_step = 0  # last step whose optimizer step ran (0 = initial weights)
        self._stop_requested = threading.Event()  # set by request_stop (SIGTERM)
        self.update_gate: Callable[[], None] | None = None
        """Called before a step's update changes weights, optimizer or schedule state: the
        previous step's checkpoint and version writes read them (step_persistence.py).
        It may raise; the step then commits nothing."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.build_optimizer_now()[0]

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.build_optimizer_now()[1]

    def build_optimizer_now(
        self,
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        """The optimizer and its LR schedule, built by the first caller (any thread).

        Not in `__init__`: torch.optim's first optimizer imports torch._dynamo, and the
        trainer needs only the model to publish version 0 and serve, so the service
        builds them on a background thread meanwhile. Building later changes nothing:
        AdamW's state starts at its first step, and nothing reads the lr before."""
        with self._optim_lock:
            if self._optim is None:
                optimizer = build_optimizer(self._trainable, self.config.optim)
                self._optim = optimizer, build_scheduler(optimizer, self.config.optim.schedule)
            return self._optim

    def stop(self) -> None:
        """Nothing to release: a `Trainer` commands no other rank (see `TorchrunLeader`)."""

    def request_stop(self) -> None:
        """Abandon the running step (and any later one) at its next micro-batch boundary:
        called from the SIGTERM handler, so a long step does not hold up the shutdown.
        One process only: under torchrun every rank must take the same decision (the
        leader would have to broadcast it), so a multi-rank step still runs to its end."""
        self._stop_requested.set()

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())  # tied weights counted once

    def hf_config(self) -> dict[str, object]:
        return self.model.args.to_hf_config()

    def describe(self) -> str:
        m = self.config.model
        return (
            f"{m.family} {self.num_parameters / 1e6:.2f}M params (dim {m.dim}, "
            f"{m.n_layers} layers, {m.n_heads}/{m.n_kv_heads} heads, vocab {m.vocab_size})"
        )

    def adapter_config(self) -> dict[str, object] | None:
        """PEFT-style description of published adapters (None unless publishing adapters)."""
        lora = self.config.model.lora
        if lora is None or lora.publish != "adapters":
            return None
        return adapter_config(lora)

    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        """Full HF-named weights, LoRA adapters merged in (a plain HF checkpoint)."""
        return publishable_state_dict(self.model)

    def state_dict_for_publish(self) -> dict[str, torch.Tensor]:
        """Full HF-named weights (LoRA merged); with `lora.publish = "adapters"`, versions
        after 0 carry only the adapters (docs/memory.md); in `publish_dtype`."""
        lora = self.config.model.lora
        dtype = self.publish_dtype
        if lora is None or lora.publish != "adapters" or self.trained_step == 0:
            return publishable_state_dict(self.model, dtype)  # cast in the one copy
        state = adapter_state_dict(self.model)
        return {n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()}

    def _set_lr(self, kind: LossKind) -> float:
        """Scale this step's lr: the schedule's factor times the peak of this kind of step."""
        optim = self.config.optim
        peak = optim.sft_lr if kind == "sft" and optim.sft_lr is not None else optim.lr
        lr = peak * lr_factor(self.scheduler.last_epoch, optim.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def train_step(
        self, step: int, batches: list[MicroBatchData], kind: LossKind
    ) -> dict[str, float]:
        """Forward/backward every micro-batch, clip, step the optimizer; return the metrics."""
        if step != self.trained_step + 1:
            raise FailedPrecondition(f"expected step {self.trained_step + 1}, got step {step}")
        start = time.perf_counter()
        lr = self._set_lr(kind)
        batches = self._prepare(batches)  # so the token metrics count trained tokens
        sums = self.compute_gradients(batches, kind)
        if self.update_gate is not None:
            try:
                self.update_gate()
            except BaseException:
                self.optimizer.zero_grad(set_to_none=True)
                raise
        # Under torchrun expert and dense weights may sit on two meshes: the context knows.
        grad_norm = self.ranks.clip_grad_norm(self.model, self.config.optim.max_grad_norm)
        finite = math.isfinite(float(grad_norm))
        if finite:
            self.optimizer.step()
        else:
            log.warning("step %d: gradient norm is %s; optimizer step skipped", step, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.trained_step = step
        seconds = time.perf_counter() - start
        tokens = sum(b.num_tokens for b in batches)
        metrics = finish_metrics({name: float(value) for name, value in sums.items()})
        metrics.update(
            grad_norm=float(grad_norm),
            skipped=0.0 if finite else 1.0,
            lr=lr,
            tokens=float(tokens),
            loss_tokens=float(sum(b.num_loss_tokens for b in batches)),
            seconds=seconds,
            tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        )
        return metrics

    def compute_gradients(
        self, batches: list[MicroBatchData], kind: LossKind
    ) -> dict[str, torch.Tensor]:
        """Fresh `.grad`s of the step's loss; returns step-level metric sums (loss, entropy…)."""
        batches = self._prepare(batches)
        counts = step_counts(batches, self.ranks.reduce)  # every sample: the loss's weights
        if counts.loss_tokens == 0:
            raise InvalidArgument("micro_batches.loss_mask", "no token of the step has loss_mask 1")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=self.device))
        metric_tokens = counts.loss_tokens
        skipping = skip_is_exact(self.config, kind, cp=self.ranks.cp)
        if skipping:
            batches, skipped = trained_batches(
                batches, keep_micro_batches=self.ranks.runs_empty_micro_batches
            )
            sums["zero_adv_skipped_samples"] += skipped.samples
            sums["zero_adv_skipped_tokens"] += skipped.tokens
            sums["loss"] += 0.0  # a step with nothing left to train has loss 0
            metric_tokens = step_counts(batches, self.ranks.reduce).loss_tokens
        for batch in batches:
            if self._stop_requested.is_set() and isinstance(self.ranks, SingleProcess):
                self.optimizer.zero_grad(set_to_none=True)
                raise StepAbandoned(
                    "the trainer is shutting down (SIGTERM): the step was abandoned at a "
                    "micro-batch boundary, before its optimizer step; it was neither trained "
                    "nor published, retry it on the restarted trainer"
                )
            if batch.num_loss_tokens == 0 and not self.ranks.runs_empty_micro_batches:
                continue  # contributes nothing (sharded ranks still run it, to stay in step)
            parts = self._backward(batch.to(self.device), kind, counts, metric_tokens)
            for name, value in parts.items():
                sums[name] += value
        if skipping and not batches:  # all skipped: the zero gradient AdamW still steps on
            for p in self._trainable:
                p.grad = torch.zeros_like(p)
        self.ranks.finish_gradients(self.model)  # e.g. expert parallelism's gradients
        # The step's metric sums over all ranks, in one collective.
        names = sorted(sums)
        if not names:  # every micro-batch of this process was empty and skipped
            return {}
        total = self.ranks.sum_over_ranks(torch.stack([sums[n].float() for n in names]))
        return dict(zip(names, total, strict=True))

    def _prepare(self, batches: list[MicroBatchData]) -> list[MicroBatchData]:
        """The micro-batches cut to `model.truncation` (unchanged without caps; idempotent),
        once checked to be trainable here (shared prompts)."""
        check_shared_prompts(batches, self.config, cp=self.ranks.cp)
        truncation = self.config.model.truncation
        if not truncation_enabled(truncation):
            return batches
        return [truncate_micro_batch(b, truncation) for b in batches]

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _target_logprobs(
        self, model: torch.nn.Module, batch: MicroBatchData, *, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(T-1,) fp32 logprob of each next token and (T-1,) entropy of each position.

        Logits at t-1 score input_ids[t], and a sample with a parent (a shared prompt)
        has its first token scored at the parent's last (`prediction_index`); the pair
        across a sample boundary is scored too but always masked (a sample's first token
        is never a loss token), which is cheaper than cutting the row apart. The entropy
        carries gradient only with `entropy_grad`. The scored rows are picked from the
        `(T, dim)` hidden states before the head, so no `(T, V)` logits are copied to
        select them; with the chunked LM head lever the `(T-1, V)` logits are never
        materialized at all (`memory/lm_head.py`).
        """
        ids, positions = batch.input_ids[None], batch.position_ids[None]
        targets = batch.input_ids[1:]  # (T-1,)
        rows = prediction_index(batch.sample_lengths, batch.sample_parents)  # (T-1,) | None
        layout = {"sample_lengths": batch.sample_lengths, "sample_parents": batch.sample_parents}
        if self.lm_head_chunk is not None:
            chunk = self.lm_head_chunk

            def head(
                hidden: torch.Tensor, weight: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:  # (1, T, dim), (V, dim) → (T-1,) twice
                scoring = hidden[0, :-1] if rows is None else hidden[0].index_select(0, rows)
                return chunked_logprobs_entropy(scoring, weight, targets, chunk=chunk)

            with self._autocast():  # through forward: FSDP gathers the root unit for it
                logprobs, entropy = model(ids, positions, **layout, head=head)
            return logprobs, entropy if entropy_grad else entropy.detach()
        if self._takes_head:  # the scored rows picked before the head: (T-1, dim), not (T-1, V)

            def dense_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
                scoring = hidden[0, :-1] if rows is None else hidden[0].index_select(0, rows)
                return torch.nn.functional.linear(scoring, weight).float()  # (T-1, V)

            with self._autocast():
                scored_logits = model(ids, positions, **layout, head=dense_head)
        else:  # transformers' model (model.impl = "hf") returns every position's logits
            with self._autocast():
                logits = model(ids, positions, **layout)[0]  # (T, V)
            scored_logits = logits[:-1] if rows is None else logits.index_select(0, rows)
        logprobs_all = torch.log_softmax(scored_logits, dim=-1)  # (T-1, V): row → its target
        entropy = token_entropy(logprobs_all if entropy_grad else logprobs_all.detach())
        return logprobs_all.gather(-1, targets[:, None]).squeeze(-1), entropy

    def _backward(
        self, batch: MicroBatchData, kind: LossKind, counts: StepCounts, metric_tokens: int
    ) -> dict[str, torch.Tensor]:
        """Forward and backward one packed micro-batch; return its detached metric parts
        (token means over the step's `metric_tokens` trained loss tokens)."""
        bonus = kind == "pg" and self.config.loss.entropy_coef > 0
        # `scored`: which tokens the logprobs score: all but the first, or under context
        # parallelism this rank's share (tidal.trainer.parallel.cp_batch).
        scored: slice | torch.Tensor = slice(1, None)
        with activation_offloading(self.config.model.ac_offloading, self.model):
            if self.ranks.cp > 1:
                logprobs_all, logprobs, scored, valid = self.ranks.cp_logprobs(
                    self.model, batch, self._autocast
                )  # (N, V), (N,), (N,), (N,)
                entropy = token_entropy(logprobs_all if bonus else logprobs_all.detach())  # (N,)
                mask = batch.loss_mask[scored] * valid  # (N,)
            else:
                logprobs, entropy = self._target_logprobs(self.model, batch, entropy_grad=bonus)
                mask = batch.loss_mask[scored]  # (T-1,)
        segments = segment_ids(batch.sample_lengths)[scored]  # (N,)
        num_segments = int(batch.sample_lengths.shape[0])
        metric_weights = mask / metric_tokens  # (T-1,) token mean over the step
        loss_cfg = self.config.loss
        if kind == "sft":
            loss, parts = sft_loss(logprobs, metric_weights)
        else:
            weights = token_weights(
                mask,
                segments,
                num_segments,
                norm=loss_cfg.norm,
                counts=counts,
                constant=loss_cfg.norm_constant,
            )  # (T-1,)
            inputs = TokenInputs(
                logprobs=logprobs,
                behaviour_logprobs=batch.behaviour_logprobs[scored],
                advantages=batch.advantages[scored],
                loss_mask=mask,
                segments=segments,
                num_segments=num_segments,
                entropy=entropy if bonus else None,
                ref_logprobs=self._reference_logprobs(batch, scored),
                staleness=token_staleness(
                    None if batch.policy_versions is None else batch.policy_versions[scored],
                    self.trained_step,  # the version this step's forward runs
                    int(mask.shape[0]),
                ),
            )
            loss, parts = rl_loss(
                inputs, config=loss_cfg, weights=weights, metric_weights=metric_weights
            )
        # Each CP rank routes its share of the row; their sum would count the row cp times.
        share = batch.num_loss_tokens / counts.loss_tokens / self.ranks.cp
        router = router_terms(self.model, share)
        if router is not None:
            loss = loss + router.loss
            parts.update(router.metrics)
        scale = self.ranks.loss_scale
        (loss * scale if scale != 1.0 else loss).backward()
        parts["entropy"] = (entropy.detach() * metric_weights).sum()
        parts["loss"] = loss.detach()
        return parts

    def _reference_logprobs(
        self, batch: MicroBatchData, scored: slice | torch.Tensor
    ) -> torch.Tensor | None:
        """(N,) logprobs of the `scored` tokens under the frozen (unsharded) reference."""
        if self.reference is None:
            return None
        with torch.no_grad():
            every = self._target_logprobs(self.reference, batch)[0]  # (T-1,): tokens 1..T-1
        return every if isinstance(scored, slice) else every[scored - 1]
