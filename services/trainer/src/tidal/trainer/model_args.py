"""`DecoderArgs` of a config-built policy (`[trainer.model]` without `path`).

Torch-free, so the memory planner and the model factory read a config the same way. The
family's switches (q/k/v biases, QK-norm, experts) come from its registry record.
"""

from __future__ import annotations

from tidal.models.args import DecoderArgs, RopeScaling
from tidal.models.families import family_of
from tidal.trainer.config import ModelConfig


def args_from_config(config: ModelConfig) -> DecoderArgs:
    """`DecoderArgs` of a config-built model (`config.path` unset). Torch-free, so the
    memory planner and the model factory read a config the same way."""
    family = family_of(config.family)
    moe = family.moe
    scaling = config.rope_scaling
    return DecoderArgs(
        vocab_size=config.vocab_size,
        dim=config.dim,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        ffn_dim=config.ffn_dim,
        max_seq_len=config.max_seq_len,
        rope_theta=config.rope_theta,
        norm_eps=config.norm_eps,
        tie_embeddings=config.tie_embeddings,
        family=config.family,
        head_dim=config.head_dim or 0,
        rope_scaling=RopeScaling(**scaling.model_dump()) if scaling is not None else None,
        attention_bias=family.attention_bias,
        qk_norm=family.qk_norm,
        n_experts=config.n_experts if moe else 0,
        n_experts_per_tok=config.n_experts_per_tok if moe else 0,
        moe_ffn_dim=config.moe_ffn_dim if moe else 0,
        norm_topk_prob=config.norm_topk_prob,
        shared_expert_ffn_dim=config.shared_expert_ffn_dim if moe else 0,
        decoder_sparse_step=config.decoder_sparse_step,
        router_aux_loss_coef=config.router_aux_loss_coef,
    )
