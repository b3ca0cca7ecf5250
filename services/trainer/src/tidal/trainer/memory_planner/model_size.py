"""Parameter counts of a decoder from its `DecoderArgs`, without building it.

Counted term by term as `models/layers.py` and `models/moe.py` create the parameters, so
the planner can size a 70B model on a laptop; a test holds the count to built models of
every family. Tied embeddings count once.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.models.args import DecoderArgs


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by where they live (elements, not bytes)."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    per_layer: tuple[int, ...]  # each decoder block
    final_norm: int

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + sum(self.per_layer) + self.final_norm


def _attention(a: DecoderArgs) -> int:
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    weights = a.dim * q + 2 * a.dim * kv + q * a.dim  # q, k, v, o projections
    biases = (q + 2 * kv) if a.attention_bias else 0
    qk_norm = 2 * a.head_dim if a.qk_norm else 0
    return weights + biases + qk_norm


def _feed_forward(a: DecoderArgs, layer: int) -> int:
    if not a.is_moe_layer(layer):
        return 3 * a.dim * a.ffn_dim  # gate, up, down
    experts = a.n_experts * 3 * a.dim * a.moe_ffn_dim  # (E, 2I, H) + (E, H, I)
    router = a.n_experts * a.dim
    shared = (3 * a.dim * a.shared_expert_ffn_dim + a.dim) if a.shared_expert_ffn_dim else 0
    return experts + router + shared


def param_counts(a: DecoderArgs) -> ParamCounts:
    per_layer = tuple(_attention(a) + _feed_forward(a, i) + 2 * a.dim for i in range(a.n_layers))
    return ParamCounts(
        embedding=a.vocab_size * a.dim,
        lm_head=0 if a.tie_embeddings else a.vocab_size * a.dim,
        per_layer=per_layer,
        final_norm=a.dim,
    )
