"""Blocks shared by every decoder family: attention, decoder block, the `DecoderLM`.

Parameter names equal Hugging Face's in-memory names, so dense families need no renaming.
Family differences are `DecoderArgs` switches read here, never copies of these classes.
One forward serves every caller: which keys a query sees is the `AttentionBackend`
passed in (packed training, plain causal, an inference KV cache). A caller may pass
`head` to replace the dense LM head inside the root forward, so FSDP gathers the root
unit's parameters for it as for the dense head.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tidal.models.args import DecoderArgs
from tidal.models.attention import (
    AttentionBackend,
    CausalAttention,
    PackedKind,
    packed_attention,
    token_multiplicity,
)
from tidal.models.mlp import MLP
from tidal.models.moe import MoEFeedForward, RouterStats, TokenCounts, load_balancing_loss
from tidal.models.rope import apply_rope, rope_tables


class HeadRMSNorm(nn.RMSNorm):
    """RMSNorm in the input's dtype: under bf16 autocast q/k arrive in bf16 and an fp32
    weight would push torch off its fused kernel. Identical to `nn.RMSNorm` in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.weight is not None
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


class Attention(nn.Module):
    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=bias)
        self.k_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.v_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        if args.qk_norm:  # over each head's D features, before RoPE (Qwen3)
            self.q_norm = HeadRMSNorm(args.head_dim, eps=args.norm_eps)
            self.k_norm = HeadRMSNorm(args.head_dim, eps=args.norm_eps)
        self.qk_norm = args.qk_norm

    def forward(
        self,
        x: torch.Tensor,  # (B, T, dim)
        cos: torch.Tensor,  # (B, 1, T, D)
        sin: torch.Tensor,
        attention: AttentionBackend,
        layer: int,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)  # (B, T, H, D)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H*, T, D)
        # Rotate in q's dtype: under bf16 autocast q is bf16 while the tables are fp32, and
        # promoting q/k to fp32 here would only add casts before attention casts them back.
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention(layer, q, k, v)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, args: DecoderArgs, layer: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.mlp: nn.Module = (
            MoEFeedForward(args) if args.is_moe_layer(layer) else MLP(args.dim, args.ffn_dim)
        )

    def forward(
        self,
        x: torch.Tensor,  # (B, T, dim)
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend,
        layer: int,
        counts: TokenCounts | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, counts) if isinstance(self.mlp, MoEFeedForward) else self.mlp(h))


class DecoderModel(nn.Module):
    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, i) for i in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)


HeadOutput = tuple[torch.Tensor, torch.Tensor]  # a replacement head's (N,) results


class DecoderLM(nn.Module):
    """A decoder-only causal LM of any supported family (`args.family`)."""

    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        self.args = args
        self.packed_kind: PackedKind = "sdpa"  # `model.attn`; set by the factory
        self.model = DecoderModel(args)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(args)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def init_weights(self, std: float = 0.02) -> None:
        """Normal(0, std) for matrices (residual outputs scaled by depth); norms 1, biases 0."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.args.n_layers))
            else:
                nn.init.normal_(p, std=std)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T) long
        position_ids: torch.Tensor,  # (B, T) long
        *,
        sample_lengths: torch.Tensor | None = None,  # (S,) for packed B == 1
        sample_parents: torch.Tensor | None = None,  # (S,) with sample_lengths
        attention: AttentionBackend | None = None,
        head: Callable[[torch.Tensor, torch.Tensor], HeadOutput] | None = None,
    ) -> torch.Tensor | HeadOutput:
        """Logits `(B, T, V)` in fp32, or what `head(hidden, weight)` returns for the
        final-norm hidden states `(B, T, dim)` and the head weight `(V, dim)`.

        `sample_lengths` is shorthand for the packed backend `model.attn` selects (SDPA
        with a block-diagonal mask, or flash-attn varlen), `sample_parents` the parent
        each sample continues (-1: none; a group's shared prompt); with neither, every
        row is one causal sequence.
        """
        hidden = self.hidden_states(
            input_ids,
            position_ids,
            sample_lengths=sample_lengths,
            sample_parents=sample_parents,
            attention=attention,
        )
        if head is not None:
            return head(hidden, self.lm_head.weight)
        return self.lm_head(hidden).float()

    def hidden_states(
        self,
        input_ids: torch.Tensor,  # (B, T) long
        position_ids: torch.Tensor,  # (B, T) long
        *,
        sample_lengths: torch.Tensor | None = None,  # (S,) for packed B == 1
        sample_parents: torch.Tensor | None = None,  # (S,) with sample_lengths
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states `(B, T, dim)`: the LM head's input (chunked head lever).

        With `sample_parents`, the routers' statistics count a parent's tokens once per
        child, as the unshared row would hold them, so the load-balancing loss is the same.
        """
        if attention is None:
            attention = (
                CausalAttention()
                if sample_lengths is None
                else packed_attention(
                    self.packed_kind, sample_lengths, input_ids.shape[1], sample_parents
                )
            )
        counts = None
        if sample_parents is not None and sample_lengths is not None and self.args.n_experts:
            per_token = token_multiplicity(sample_lengths, sample_parents)  # (T,)
            counts = TokenCounts(per_token.to(input_ids.device), int(per_token.sum()))
        x = self.model.embed_tokens(input_ids)  # (B, T, dim)
        cos = self.rope_cos[position_ids].unsqueeze(1).to(x.dtype)  # (B, 1, T, D)
        sin = self.rope_sin[position_ids].unsqueeze(1).to(x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, attention, i, counts)
        return self.model.norm(x)

    def router_stats(self) -> list[RouterStats]:
        """Routing statistics of the last forward, one per MoE block (empty when dense)."""
        return [
            block.mlp.last_stats
            for block in self.model.layers
            if isinstance(block.mlp, MoEFeedForward) and block.mlp.last_stats is not None
        ]

    def aux_loss(self) -> torch.Tensor:
        """Load-balancing loss of the last forward (unscaled; 0 for dense models).

        Training adds `args.router_aux_loss_coef * model.aux_loss()` to the loss.
        """
        stats = self.router_stats()
        if not stats:
            return torch.zeros((), device=self.lm_head.weight.device)
        return load_balancing_loss(stats, top_k=self.args.n_experts_per_tok)

    def expert_load(self) -> torch.Tensor:
        """(L_moe, E) share of routed token slots per expert in the last forward (rows sum to 1)."""
        stats = self.router_stats()
        if not stats:
            return torch.zeros(0, self.args.n_experts)
        counts = torch.stack([s.tokens_per_expert for s in stats])  # (L, E)
        return counts / counts.sum(dim=-1, keepdim=True).clamp(min=1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets) under logits: (..., V), (...) → (...)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
