"""The SwiGLU feed-forward, shared by dense blocks and MoE shared experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x)), HF's `gate_proj` / `up_proj` / `down_proj` names."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., dim) → (..., dim)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
