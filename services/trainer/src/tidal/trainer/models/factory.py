"""Build the policy model from `ModelConfig`, and move its weights to and from the HF layout.

Decisions:
- Weights are built from the config under a fixed seed (`run.seed`), in fp32: the trainer
  keeps fp32 master weights; lower-precision compute is a later memory lever.
- The seed is applied inside `torch.random.fork_rng`, so building a model neither depends
  on nor disturbs the process-wide RNG state.
- Published state dicts follow the Hugging Face convention for tied embeddings: when
  `tie_embeddings` is set, `lm_head.weight` is *not* saved (it is the same tensor as
  `model.embed_tokens.weight`). `load_published_state_dict` loads such a dict with
  `strict=False`, checks that only `lm_head.weight` was missing, and relies on the tie the
  model constructor made (the head is the embedding, so it is loaded too). Inference
  should load published weights through it (or do the same).
"""

from __future__ import annotations

from typing import Any

import torch

from tidal.trainer.config import ModelConfig
from tidal.trainer.models.llama.model import LlamaArgs, LlamaForCausalLM

TIED_HEAD = "lm_head.weight"


def llama_args(config: ModelConfig) -> LlamaArgs:
    return LlamaArgs(
        vocab_size=config.vocab_size,
        dim=config.dim,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        ffn_dim=config.ffn_dim,
        max_seq_len=config.max_seq_len,
        rope_theta=config.rope_theta,
        tie_embeddings=config.tie_embeddings,
    )


def build_model(config: ModelConfig, *, seed: int, device: Any = "cpu") -> LlamaForCausalLM:
    """A freshly initialised fp32 model; the same (config, seed) gives the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_args(config))
        model.init_weights(config.init_std)
    return model.to(device=device, dtype=torch.float32)


def publishable_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the weights in HF naming (no tied `lm_head.weight`)."""
    state = model.state_dict()
    if model.args.tie_embeddings:
        state.pop(TIED_HEAD, None)
    return {name: t.detach().to("cpu", copy=True) for name, t in state.items()}


def load_published_state_dict(model: LlamaForCausalLM, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a published (HF-style) state dict, restoring the tied head if it was dropped."""
    result = model.load_state_dict(state_dict, strict=False)
    missing = set(result.missing_keys)
    if model.args.tie_embeddings:
        missing.discard(TIED_HEAD)
    if missing or result.unexpected_keys:
        raise ValueError(
            f"state dict does not match the model: missing {sorted(missing)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )
    if model.args.tie_embeddings:
        # load_state_dict copies in place, so the tie survives; guard against a model whose
        # tie was broken (e.g. by a later .to() on a meta model).
        assert model.lm_head.weight is model.model.embed_tokens.weight
