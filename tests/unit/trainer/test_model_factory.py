"""Building the policy from config, and its published (HF-style) weights round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from tidal.trainer.config import ModelConfig, TrainerRunConfig
from tidal.trainer.models.factory import (
    build_model,
    load_published_state_dict,
    publishable_state_dict,
)
from tidal.trainer.models.llama.model import LlamaArgs, LlamaForCausalLM
from tidal.weights.folder import load_version, write_version

TINY = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=16)


def test_same_seed_same_weights_and_rng_untouched() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(TINY, seed=7)
    assert torch.equal(torch.rand(1), expected_next)  # building did not consume global RNG
    b, c = build_model(TINY, seed=7), build_model(TINY, seed=8)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert all(p.dtype == torch.float32 for p in a.parameters())


def test_published_weights_drop_the_tied_head_and_load_back(tmp_path: Path) -> None:
    model = build_model(TINY, seed=0)
    state = publishable_state_dict(model)
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state
    manifest = write_version(
        tmp_path, version=0, step=0, state_dict=state, config=model.args.to_hf_config()
    )
    hf_config, loaded = load_version(manifest)
    assert hf_config["tie_word_embeddings"] is True

    fresh = LlamaForCausalLM(LlamaArgs.from_hf_config(hf_config))
    load_published_state_dict(fresh, loaded)
    ids = torch.tensor([[256, 72, 105, 33]])
    pos = torch.arange(4)[None]
    torch.testing.assert_close(fresh(ids, pos), model(ids, pos), rtol=0, atol=0)


def test_loading_refuses_missing_weights() -> None:
    model = build_model(TINY, seed=0)
    state = publishable_state_dict(model)
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        load_published_state_dict(build_model(TINY, seed=1), state)


def test_vocab_smaller_than_the_tokenizer_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="smaller than the tokenizer's vocabulary"):
        ModelConfig(vocab_size=200)


def test_publish_dir_defaults_to_the_weightsync_root_of_the_run() -> None:
    config = TrainerRunConfig.model_validate({"run": {"name": "r", "output_dir": "/o"}})
    assert config.publish_dir == Path("/o/r/weights")
    assert config.trainer.model.dim == 128 and config.trainer.num_threads == 1
