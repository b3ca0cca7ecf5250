"""`model.impl = "hf"`: transformers' implementation behind our model's forward contract.

The wrapper registers the transformers model's `model` and `lm_head` as its children, so
parameter names are exactly HF's and publishing, optimizers and checkpoints see the same
names as with ours. Packed rows get a 4D causal mask, block-diagonal but for shared
prefixes (transformers takes it as is); other attention backends (a KV cache, context
parallelism) cannot be injected and are refused. `args` is our `DecoderArgs` where we
know the architecture (so the family's state-dict adapter applies), else `HFArgs`, the
shape fields other code reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tidal.models.args import DecoderArgs
from tidal.models.attention import (
    AttentionBackend,
    CausalAttention,
    PackedCausalAttention,
    packed_causal_mask,
)
from tidal.models.families import UnsupportedArchitecture
from tidal.models.hf_config import UnsupportedConfig


@dataclass(frozen=True)
class HFArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_seq_len: int
    tie_embeddings: bool
    family: str
    hf_config: dict[str, Any] = field(compare=False, repr=False)

    def to_hf_config(self) -> dict[str, Any]:
        return dict(self.hf_config)


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - transformers is in the dev extra
        raise ImportError(
            'model.impl = "hf" needs the transformers package (pip install transformers)'
        ) from e
    return transformers


def _args(hf_config: dict[str, Any], config: Any) -> DecoderArgs | HFArgs:
    """Our `DecoderArgs` where we know the architecture (so adapters apply), else a record."""
    try:
        return DecoderArgs.from_hf_config(hf_config)
    except (UnsupportedArchitecture, UnsupportedConfig):
        pass
    heads = config.num_attention_heads
    return HFArgs(
        vocab_size=config.vocab_size,
        dim=config.hidden_size,
        n_layers=config.num_hidden_layers,
        n_heads=heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        max_seq_len=config.max_position_embeddings,
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        family=config.model_type,
        hf_config=dict(hf_config),
    )


class HFCausalLM(nn.Module):
    def __init__(self, hf_config: dict[str, Any]) -> None:
        super().__init__()
        transformers = _import_transformers()
        settings = dict(hf_config)
        model_type = settings.pop("model_type", None)
        if model_type is None:
            raise ValueError("config.json has no 'model_type'; transformers cannot build it")
        config = transformers.AutoConfig.for_model(model_type, **settings)
        hf = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", dtype=torch.float32
        )
        object.__setattr__(self, "_hf", hf)  # unregistered: parameters come via children
        self.model = hf.model
        self.lm_head = hf.lm_head
        self.packed_kind = "sdpa"  # packed rows always go through SDPA with a 4D mask here
        self.args: DecoderArgs | HFArgs = _args(hf_config, config)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def init_weights(self, std: float = 0.02) -> None:
        """transformers' own initialization already ran in the constructor."""

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        position_ids: torch.Tensor,  # (B, T)
        *,
        sample_lengths: torch.Tensor | None = None,
        sample_parents: torch.Tensor | None = None,
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        mask = None
        if isinstance(attention, PackedCausalAttention):
            mask = attention.mask
        elif attention is None and sample_lengths is not None:
            mask = packed_causal_mask(
                sample_lengths, input_ids.shape[1], sample_parents
            )  # (1, 1, T, T)
        elif attention is not None and not isinstance(attention, CausalAttention):
            raise ValueError(
                f'model.impl = "hf" cannot use attention backend {type(attention).__name__}; '
                'it supports plain causal and packed attention (use model.impl = "custom")'
            )
        out = self._hf(
            input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=False
        )
        return out.logits.float()  # (B, T, V)
