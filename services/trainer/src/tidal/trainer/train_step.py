"""The `Trainer`: one optimizer step over a step's packed micro-batches.

Decisions:
- Single process, fp32 master weights, AdamW (no weight decay on 1-D params: norms).
  Parallelism and memory levers wrap this later without changing the step's shape.
- Gradient accumulation over micro-batches, each loss already divided by the step's
  total loss tokens (see `loss.py`), so packing never changes the result.
- Packed forward: one `[1, T]` row per micro-batch with `sample_lengths` (block-diagonal
  causal mask, positions restarting per sample). Logits at t-1 score input_ids[t]; the
  pair across a sample boundary is scored too but always masked (loss_mask is 0 at every
  sample's first token), which is cheaper than cutting the row apart.
- A non-finite gradient norm skips the optimizer step (metric `skipped` = 1) instead of
  writing NaNs into the weights; the step still counts as trained, so the run goes on.
- This class is synchronous and knows nothing about gRPC or publishing; the service runs
  it in a worker thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from typing import Literal

import torch

from tidal.common.errors import FailedPrecondition, InvalidArgument
from tidal.trainer.batch import MicroBatchData
from tidal.trainer.config import TrainerConfig
from tidal.trainer.loss import policy_gradient_loss, sft_loss, token_entropy
from tidal.trainer.models.factory import build_model, publishable_state_dict

log = logging.getLogger(__name__)

LossKind = Literal["pg", "sft"]


class Trainer:
    def __init__(self, config: TrainerConfig, *, seed: int, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.model = build_model(config.model, seed=seed, device=device)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        optim = config.optim
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": optim.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
        )
        self.trained_step = 0  # last step whose optimizer step ran (0 = initial weights)

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

    def state_dict_for_publish(self) -> dict[str, torch.Tensor]:
        return publishable_state_dict(self.model)

    def train_step(
        self, step: int, batches: list[MicroBatchData], kind: LossKind
    ) -> dict[str, float]:
        """Forward/backward every micro-batch, clip, step AdamW; return the step's metrics."""
        if step != self.trained_step + 1:
            raise FailedPrecondition(f"expected step {self.trained_step + 1}, got step {step}")
        start = time.perf_counter()
        optim = self.config.optim
        lr = optim.sft_lr if kind == "sft" and optim.sft_lr is not None else optim.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums = self.compute_gradients(batches, kind)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), optim.max_grad_norm)
        finite = math.isfinite(float(grad_norm))
        if finite:
            self.optimizer.step()
        else:
            log.warning("step %d: gradient norm is %s; optimizer step skipped", step, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.trained_step = step
        seconds = time.perf_counter() - start
        tokens = sum(b.num_tokens for b in batches)
        metrics = {name: float(value) for name, value in sums.items()}
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
        total_tokens = sum(b.num_loss_tokens for b in batches)
        if total_tokens == 0:
            raise InvalidArgument("micro_batches.loss_mask", "no token of the step has loss_mask 1")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=self.device))
        for batch in batches:
            if batch.num_loss_tokens == 0:
                continue  # contributes nothing to loss or gradient
            for name, value in self._backward(batch.to(self.device), kind, total_tokens).items():
                sums[name] += value
        return dict(sums)

    def _backward(
        self, batch: MicroBatchData, kind: LossKind, total_tokens: int
    ) -> dict[str, torch.Tensor]:
        """Forward and backward one packed micro-batch; return its detached metric parts."""
        ids = batch.input_ids[None]  # (1, T)
        logits = self.model(ids, batch.position_ids[None], sample_lengths=batch.sample_lengths)[
            0
        ]  # (T, V) fp32
        logprobs_all = torch.log_softmax(logits[:-1], dim=-1)  # (T-1, V): row t scores ids[t+1]
        targets = batch.input_ids[1:]  # (T-1,)
        logprobs = logprobs_all.gather(-1, targets[:, None]).squeeze(-1)  # (T-1,)
        mask = batch.loss_mask[1:]  # (T-1,)
        if kind == "sft":
            loss, parts = sft_loss(logprobs, mask, total_tokens=total_tokens)
        else:
            loss, parts = policy_gradient_loss(
                logprobs,
                batch.behaviour_logprobs[1:],
                batch.advantages[1:],
                mask,
                clip_low=self.config.loss.clip_low,
                clip_high=self.config.loss.clip_high,
                total_tokens=total_tokens,
            )
        loss.backward()
        with torch.no_grad():
            entropy = token_entropy(logprobs_all.detach())  # (T-1,)
            parts["entropy"] = (entropy * mask).sum() / total_tokens
        parts["loss"] = loss.detach()
        return parts
