"""Chunked LM head: next-token logprobs and entropy without `[tokens, vocab]` logits.

One autograd Function over hidden states `(N, D)`, the head weight `(V, D)` and targets:
forward computes `(chunk, V)` fp32 logits at a time and keeps only each row's
log-sum-exp and entropy; backward recomputes each chunk's logits, so the saved state is
O(N) besides the inputs. Per row, d logp_t/dz = onehot(t) − p and dH/dz = −p·(log p + H).
The matmul runs in the hidden states' dtype, the softmax arithmetic in fp32.
"""

from __future__ import annotations

from typing import Any

import torch


def _accumulate_dtype(hidden: torch.Tensor) -> torch.dtype:
    """fp32 for bf16/fp32 inputs, fp64 for fp64 (gradcheck)."""
    return torch.promote_types(hidden.dtype, torch.float32)


def _logits_grad(
    logits: torch.Tensor,  # (c, V), consumed (overwritten)
    lse: torch.Tensor,  # (c,)
    entropy: torch.Tensor,  # (c,)
    targets: torch.Tensor,  # (c,)
    g_logp: torch.Tensor | None,  # (c,)
    g_ent: torch.Tensor | None,  # (c,)
) -> torch.Tensor:
    """(c, V) gradient wrt the logits: g·(onehot - p) - g_H·p·(log p + H).

    Written as -p·(g + g_H·(log p + H)) + onehot·g with in-place ops on the two `(c, V)`
    buffers it needs (log p, then p), instead of a fresh tensor per elementwise op.
    """
    log_p = logits.sub_(lse[:, None])  # (c, V)
    p = log_p.exp()  # (c, V)
    if g_ent is None:
        assert g_logp is not None
        grad_z = p.mul_(g_logp[:, None].neg())
    else:
        coef = log_p.add_(entropy[:, None]).mul_(g_ent[:, None])  # g_H·(log p + H)
        if g_logp is not None:
            coef.add_(g_logp[:, None])
        grad_z = p.mul_(coef).neg_()
    if g_logp is not None:
        grad_z.scatter_add_(-1, targets[:, None], g_logp[:, None])
    return grad_z


class _ChunkedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,  # (N, D)
        weight: torch.Tensor,  # (V, D)
        targets: torch.Tensor,  # (N,) int64
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, acc = hidden.shape[0], _accumulate_dtype(hidden)
        logprobs = hidden.new_empty(n, dtype=acc)  # (N,)
        entropy = hidden.new_empty(n, dtype=acc)  # (N,)
        lse = hidden.new_empty(n, dtype=acc)  # (N,)
        w = weight.to(hidden.dtype)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            shifted = (hidden[start:end] @ w.T).to(acc)  # (c, V) logits z
            top = shifted.amax(dim=-1, keepdim=True)  # (c, 1)
            shifted.sub_(top)  # z - max, in place
            e = shifted.exp()  # (c, V) the one exp of the forward
            total = e.sum(dim=-1)  # (c,) Σ exp(z - max)
            log_total = total.log()  # (c,)
            lse[start:end] = top.squeeze(-1) + log_total
            picked = shifted.gather(-1, targets[start:end, None]).squeeze(-1)  # (c,)
            logprobs[start:end] = picked - log_total
            # H = -Σ p log p = log Σe - Σ e·(z - max) / Σe
            entropy[start:end] = log_total - e.mul_(shifted).sum(dim=-1) / total
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.chunk = chunk
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        n, chunk = hidden.shape[0], ctx.chunk
        w = weight.to(hidden.dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None  # (N, D)
        acc = _accumulate_dtype(hidden)
        grad_weight = (
            torch.zeros_like(weight, dtype=acc) if ctx.needs_input_grad[1] else None
        )  # (V, D)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            h = hidden[start:end]  # (c, D)
            grad_z = _logits_grad(
                (h @ w.T).to(acc),
                lse[start:end],
                entropy[start:end],
                targets[start:end],
                None if grad_logprobs is None else grad_logprobs[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
            ).to(hidden.dtype)  # (c, V)
            if grad_hidden is not None:
                torch.matmul(grad_z, w, out=grad_hidden[start:end])  # (c, D)
            if grad_weight is not None and grad_weight.dtype == h.dtype:
                grad_weight.addmm_(grad_z.T, h)  # (V, D), no temporary
            elif grad_weight is not None:
                grad_weight += (grad_z.T @ h).to(acc)  # (V, D)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None


def chunked_logprobs_entropy(
    hidden: torch.Tensor,  # (N, D) final-norm hidden states
    weight: torch.Tensor,  # (V, D) LM head weight
    targets: torch.Tensor,  # (N,) int64 next tokens
    *,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) log p(target) and (N,) entropy of each row's next-token distribution, in fp32."""
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0, got {chunk}")
    result: tuple[torch.Tensor, torch.Tensor] = _ChunkedLogprobEntropy.apply(
        hidden, weight, targets, chunk
    )
    return result
