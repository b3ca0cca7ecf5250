"""Building the served model from an HF config and loading published weights into it."""

from __future__ import annotations

import pytest
import torch

from tidal.inference.loading import build_model, check_compatible, describe_model, load_weights
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM

ARGS = DecoderArgs(
    vocab_size=40, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=16
)
CPU = torch.device("cpu")


def source() -> dict[str, torch.Tensor]:
    model = DecoderLM(ARGS)
    model.init_weights(std=0.5)
    return {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def test_tied_head_may_be_omitted_and_follows_the_embedding() -> None:
    model = build_model(ARGS.to_hf_config(), device=CPU, dtype=torch.float32)
    state = source()
    load_weights(model, state)
    assert torch.equal(model.model.embed_tokens.weight, state["model.embed_tokens.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_the_description_tells_apart_folders_of_one_family_and_shape() -> None:
    """Two Qwen3 2x64 folders, a Qwen tokenizer's vocabulary or another, tied or not."""
    shape = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=16,
                 family="qwen3", head_dim=16, qk_norm=True)  # fmt: skip
    qwen = DecoderLM(DecoderArgs(vocab_size=151_936, tie_embeddings=True, **shape))
    assert describe_model(qwen) == "qwen3-2x64 (vocab 151,936, tied, 9.8M params)"
    other = DecoderLM(DecoderArgs(vocab_size=32_000, tie_embeddings=False, **shape))
    assert describe_model(other) == "qwen3-2x64 (vocab 32,000, untied, 4.17M params)"


def test_bad_state_dict_changes_nothing() -> None:
    model = build_model(ARGS.to_hf_config(), device=CPU, dtype=torch.float32)
    good = source()
    load_weights(model, good)
    bad = source()
    bad["model.norm.weight"] = torch.ones(3)  # wrong shape, after good tensors in order
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(3,\)"):
        load_weights(model, bad)
    assert torch.equal(model.model.embed_tokens.weight, good["model.embed_tokens.weight"])
    extra = {**source(), "model.extra": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"unexpected \['model.extra'\]"):
        load_weights(model, extra)


def test_untied_model_requires_the_head() -> None:
    untied = DecoderArgs(**{**ARGS.as_dict(), "tie_embeddings": False})
    model = build_model(untied.to_hf_config(), device=CPU, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        load_weights(model, source())


def test_bfloat16_model_keeps_fp32_rope_tables_and_fp32_logits() -> None:
    model = build_model(ARGS.to_hf_config(), device=CPU, dtype=torch.bfloat16)
    load_weights(model, source())
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert model.rope_cos.dtype == torch.float32
    logits = model(torch.tensor([[1, 2, 3]]), torch.arange(3)[None])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_config_change_is_refused() -> None:
    model = build_model(ARGS.to_hf_config(), device=CPU, dtype=torch.float32)
    wider = DecoderArgs(**{**ARGS.as_dict(), "dim": 32})
    with pytest.raises(ValueError, match=r"'dim': \(16, 32\)"):
        check_compatible(model, wider.to_hf_config())
    check_compatible(model, ARGS.to_hf_config())
