"""Building the policy from `[trainer.model]` (fresh, from a folder, on transformers), and
its published (HF-style) weights round trip."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from tidal.models.args import DecoderArgs
from tidal.models.hf_checkpoint import load_published_state_dict, publishable_state_dict
from tidal.models.hf_model import HFCausalLM
from tidal.models.layers import DecoderLM
from tidal.trainer.config import ModelConfig, TrainerRunConfig
from tidal.trainer.model_factory import build_model, with_packed_kind
from tidal.weights.folder import load_version, write_version

from ...hf_folders import export_model

TINY = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=16)
TINY_MOE = ModelConfig(
    family="qwen3_moe", dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48,
    n_experts=4, n_experts_per_tok=2, moe_ffn_dim=16, max_seq_len=32, tie_embeddings=False,
)  # fmt: skip
TRAINER_PYPROJECT = Path(__file__).resolve().parents[3] / "services" / "trainer" / "pyproject.toml"
IDS = torch.tensor([[3, 250, 17, 99, 5, 64]])
POS = torch.arange(6)[None]


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

    fresh = DecoderLM(DecoderArgs.from_hf_config(hf_config))
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


def test_publish_dir_defaults_to_the_weightsync_root_of_the_run() -> None:
    config = TrainerRunConfig.model_validate({"run": {"name": "r", "output_dir": "/o"}})
    assert config.publish_dir == Path("/o/r/weights")
    assert config.trainer.model.dim == 128 and config.trainer.num_threads == 1


def test_family_switches_come_from_the_family_record() -> None:
    qwen2 = build_model(TINY.model_copy(update={"family": "qwen2"}), seed=0)
    qwen3 = build_model(TINY.model_copy(update={"family": "qwen3"}), seed=0)
    assert qwen2.args.attention_bias and not qwen2.args.qk_norm
    assert qwen3.args.qk_norm and not qwen3.args.attention_bias
    assert build_model(TINY_MOE, seed=0).args.n_experts == 4


def test_build_model_from_a_folder_path(tmp_path: Path) -> None:
    model = build_model(TINY_MOE, seed=0)
    export_model(model, tmp_path / "model")
    loaded = build_model(ModelConfig(path=tmp_path / "model"), seed=123)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS, POS), model(IDS, POS), rtol=0, atol=0)


def test_build_model_with_hf_impl_is_seeded_and_refuses_flash_attention() -> None:
    pytest.importorskip("transformers")
    config = TINY_MOE.model_copy(update={"impl": "hf", "family": "qwen3"})
    a, b = build_model(config, seed=5), build_model(config, seed=5)
    assert isinstance(a, HFCausalLM) and a.args == b.args
    torch.testing.assert_close(a(IDS, POS), b(IDS, POS), rtol=0, atol=0)
    with pytest.raises(ValueError, match="needs our implementation"):
        with_packed_kind(a, "flash_attention_2")


def test_flash_attention_without_the_package_is_a_config_error() -> None:
    if flash_installed():
        pytest.skip("flash-attn is installed here")
    with pytest.raises(ValidationError, match="flash-attn package, which is not installed"):
        ModelConfig(attn="flash_attention_2")


def test_the_flash_attention_install_hint_names_an_optional_extra_that_exists() -> None:
    if flash_installed():
        pytest.skip("flash-attn is installed here")
    with pytest.raises(ValidationError) as refused:
        ModelConfig(attn="flash_attention_2")
    hint = re.search(r'pip install "tidal-trainer\[([\w-]+)\]"', str(refused.value))
    assert hint is not None, str(refused.value)
    project = tomllib.loads(TRAINER_PYPROJECT.read_text())["project"]
    extra = project["optional-dependencies"].get(hint.group(1), [])
    assert any(req.startswith("flash-attn") for req in extra)
    assert not any(req.startswith("flash-attn") for req in project["dependencies"])


def flash_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None
