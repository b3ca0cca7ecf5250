"""A Llama-family decoder (GQA, RoPE, RMSNorm, SwiGLU), shared by trainer and inference.

Decisions:
- Parameter names equal Hugging Face's `LlamaForCausalLM` names, so published weights are
  an HF-style folder (config.json + model.safetensors) with no renaming step.
- One forward serves every caller: which keys each query sees is decided by the
  `AttentionBackend` passed in (`tidal.trainer.models.attention`): packed training
  (`[1, T]` with positions restarting per sample), plain causal attention, or an
  inference engine's KV-cache backend. The model itself knows nothing of caches or masks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tidal.trainer.models.attention import (
    AttentionBackend,
    CausalAttention,
    PackedCausalAttention,
)


@dataclass(frozen=True)
class LlamaArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_hf_config(self) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "intermediate_size": self.ffn_dim,
            "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> LlamaArgs:
        return cls(
            vocab_size=config["vocab_size"],
            dim=config["hidden_size"],
            n_layers=config["num_hidden_layers"],
            n_heads=config["num_attention_heads"],
            n_kv_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
            ffn_dim=config["intermediate_size"],
            max_seq_len=config["max_position_embeddings"],
            rope_theta=config.get("rope_theta", 10000.0),
            norm_eps=config.get("rms_norm_eps", 1e-5),
            tie_embeddings=config.get("tie_word_embeddings", False),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rope_tables(args: LlamaArgs, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: `[max_seq_len, head_dim]` in HF's rotate-half layout."""
    d = args.head_dim
    inv_freq = 1.0 / (
        args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    )
    t = torch.arange(args.max_seq_len, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)  # (S, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (S, D)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin: (B, 1, T, D)."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.q_proj = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.k_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.v_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, dim)
        cos: torch.Tensor,  # (B, 1, T, D)
        sin: torch.Tensor,
        attention: AttentionBackend,
        layer: int,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention(layer, q, k, v)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.up_proj = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.down_proj = nn.Linear(args.ffn_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.mlp = MLP(args)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend,
        layer: int,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.args = args
        self.model = LlamaModel(args)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(args)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, std: float = 0.02) -> None:
        """Normal(0, std) for linears and embeddings; residual outputs scaled by depth."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.args.n_layers))
            else:
                nn.init.normal_(p, std=std)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T) long
        position_ids: torch.Tensor,  # (B, T) long
        *,
        sample_lengths: torch.Tensor | None = None,  # (S,) for packed B == 1
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        """Logits `(B, T, V)` in fp32.

        `sample_lengths` is shorthand for `attention=PackedCausalAttention(...)`; with
        neither, every row is one causal sequence.
        """
        if attention is None:
            attention = (
                CausalAttention()
                if sample_lengths is None
                else PackedCausalAttention(sample_lengths, input_ids.shape[1])
            )
        x = self.model.embed_tokens(input_ids)  # (B, T, dim)
        cos = self.rope_cos[position_ids].unsqueeze(1).to(x.dtype)  # (B, 1, T, D)
        sin = self.rope_sin[position_ids].unsqueeze(1).to(x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, attention, i)
        return self.lm_head(self.model.norm(x)).float()


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets) under logits: (..., V), (...) → (...)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
