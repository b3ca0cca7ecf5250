"""Mixture-of-experts feed-forward (Qwen3-MoE style) with grouped expert compute.

The router is Qwen3-MoE's (fp32 softmax, top-k, optional renormalization), with
Qwen2-MoE's optional sigmoid-gated shared expert. Experts are stacked in transformers'
in-memory layout (the checkpoint layout is the state-dict adapter's) and computed as one
grouped matmul per projection over tokens sorted by expert, never a loop over tokens.
The block records `RouterStats` of its last forward for the load-balancing loss, so the
forward returns the same logits for dense and MoE models. Expert parallelism installs
`dispatch` from outside; the block itself never touches torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tidal.models.args import DecoderArgs
from tidal.models.mlp import MLP

# (tokens (N, H), top-k expert ids (N, k), top-k weights (N, k), local experts) → (N, H)
Dispatch = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "GroupedExperts"], torch.Tensor]


@dataclass(frozen=True)
class TokenCounts:
    """How many training sequences each routed token stands for: a prompt shared by k
    completions is routed once but counts k times, as in the unshared row."""

    per_token: torch.Tensor  # (N,) float
    total: int  # Σ per_token


@dataclass
class RouterStats:
    tokens_per_expert: torch.Tensor  # (E,) float: top-k assignments per expert (no grad)
    prob_per_expert: torch.Tensor  # (E,) float32: summed router probabilities (with grad)
    n_tokens: int


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of `x` grouped by expert times that expert's matrix.

    x: (M, K) with expert e's rows contiguous and `counts[e]` of them; w: (E, K, N) → (M, N).
    """
    align = 16 // x.element_size()
    # CPU takes fp32 and bf16; CUDA kernels take bf16 only (and are untested here: no GPU).
    kernel_dtype = x.device.type == "cpu" or x.dtype == torch.bfloat16
    aligned = x.shape[1] % align == 0 and w.shape[2] % align == 0
    if hasattr(torch, "_grouped_mm") and kernel_dtype and aligned:
        offs = torch.cumsum(counts, dim=0).to(torch.int32)  # (E,) end offset of each group
        return torch._grouped_mm(x.contiguous(), w, offs=offs)
    pieces = torch.split(x, counts.tolist())
    return torch.cat([p @ w[e] for e, p in enumerate(pieces)], dim=0)


class Router(nn.Module):
    """Top-k softmax router; `weight` is HF's `mlp.gate.weight` `(E, H)`."""

    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = args.n_experts_per_tok, args.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(args.n_experts, args.dim))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, H) → probs (N, E) fp32, top-k weights (N, k) in x's dtype, indices (N, k)."""
        probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)  # (N, E)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)  # (N, k)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return probs, top_w.to(x.dtype), top_i


class GroupedExperts(nn.Module):
    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        e, h, i = args.n_experts, args.dim, args.moe_ffn_dim
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))  # (E, 2I, H)
        self.down_proj = nn.Parameter(torch.empty(e, h, i))  # (E, H, I)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x: (M, H) sorted by expert, `counts[e]` rows each → (M, H)."""
        gate_up, down = self._local(self.gate_up_proj, x), self._local(self.down_proj, x)
        gate, up = grouped_mm(x, gate_up.transpose(1, 2), counts).chunk(2, dim=-1)
        return grouped_mm(F.silu(gate) * up, down.transpose(1, 2), counts)

    @staticmethod
    def _local(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The weight as a plain tensor: under expert parallelism it is a DTensor holding
        this rank's experts (`to_local` keeps the gradient path), used in the tokens' dtype
        as FSDP's mixed precision would gather it. Unchanged otherwise."""
        if hasattr(weight, "to_local"):
            return weight.to_local().to(x.dtype)
        return weight


class MoEFeedForward(nn.Module):
    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        self.n_experts = args.n_experts
        self.gate = Router(args)
        self.experts = GroupedExperts(args)
        if args.shared_expert_ffn_dim:
            self.shared_expert = MLP(args.dim, args.shared_expert_ffn_dim)
            self.shared_expert_gate = nn.Linear(args.dim, 1, bias=False)
        self.has_shared = bool(args.shared_expert_ffn_dim)
        self.last_stats: RouterStats | None = None
        self.dispatch: Dispatch | None = None  # set by expert parallelism (parallel/ep.py)

    def forward(
        self, hidden: torch.Tensor, token_counts: TokenCounts | None = None
    ) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])  # (N, H)
        probs, top_w, top_i = self.gate(x)  # (N, E), (N, k), (N, k)
        flat_expert = top_i.reshape(-1)  # (N·k,)
        counts = torch.bincount(flat_expert, minlength=self.n_experts)  # (E,)
        if self.dispatch is not None:
            out = self.dispatch(x, top_i, top_w, self.experts)  # (N, H)
        else:
            k = top_i.shape[1]
            order = torch.argsort(flat_expert, stable=True)  # (N·k,) pairs grouped by expert
            token = order // k  # (N·k,) source token of each sorted pair
            y = self.experts(x[token], counts)  # (N·k, H)
            y = y * top_w.reshape(-1)[order, None]
            out = torch.zeros_like(x).index_add_(0, token, y)  # (N, H)
        if self.has_shared:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        self.last_stats = _router_stats(probs, flat_expert, counts, weights=token_counts)
        return out.reshape(shape)


def _router_stats(
    probs: torch.Tensor,  # (N, E)
    flat_expert: torch.Tensor,  # (N·k,) token-major
    counts: torch.Tensor,  # (E,) assignments per expert
    *,
    weights: TokenCounts | None,
) -> RouterStats:
    """This forward's routing statistics, each token counted `weights.per_token` times."""
    if weights is None:
        return RouterStats(counts.detach().float(), probs.sum(dim=0), probs.shape[0])
    w = weights.per_token.to(probs.dtype)  # (N,)
    pair_w = w.repeat_interleave(flat_expert.shape[0] // w.shape[0])  # (N·k,)
    per_expert = torch.zeros_like(probs[0]).index_add_(0, flat_expert, pair_w)  # (E,)
    return RouterStats(per_expert.detach(), (probs * w[:, None]).sum(dim=0), weights.total)


def load_balancing_loss(stats: list[RouterStats], *, top_k: int) -> torch.Tensor:
    """Switch-Transformer auxiliary loss E·Σ_e f_e·P_e over all MoE layers together.

    f_e = share of tokens routed to e (counted over top-k, so Σ f = k), P_e = mean router
    probability of e; both pooled over every layer's tokens, as HF's
    `load_balancing_loss_func` pools them. Uniform routing gives k.
    """
    n = sum(s.n_tokens for s in stats)
    f = torch.stack([s.tokens_per_expert for s in stats]).sum(dim=0) / n  # (E,)
    p = torch.stack([s.prob_per_expert for s in stats]).sum(dim=0) / n  # (E,)
    return (f.to(p.device) * p).sum() * len(f)
