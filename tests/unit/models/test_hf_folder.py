"""Reading and writing HF model folders: shards, bad folders, and `impl`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tidal.models.args import DecoderArgs
from tidal.models.families import UnsupportedArchitecture
from tidal.models.hf_checkpoint import load_hf_folder, publishable_state_dict
from tidal.models.hf_folder import (
    INDEX,
    ModelFolderError,
    folder_files,
    read_config,
    write_config,
    write_folder,
)
from tidal.models.hf_model import HFCausalLM
from tidal.models.layers import DecoderLM
from tidal.models.state_dict_adapter import WeightMismatch

from ...hf_folders import export_model
from .conftest import seeded_model

SUPPORTED = r"supported: \['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'"
TINY_MOE = DecoderArgs(
    vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48,
    max_seq_len=32, tie_embeddings=False, family="qwen3_moe", qk_norm=True, n_experts=4,
    n_experts_per_tok=2, moe_ffn_dim=16,
)  # fmt: skip
IDS = torch.tensor([[3, 250, 17, 99, 5, 64]])
POS = torch.arange(6)[None]


def exported(tmp_path: Path, args: DecoderArgs = TINY_MOE, **kw: Any) -> tuple[Path, Any]:
    model = seeded_model(args, seed=0)
    export_model(model, tmp_path / "model", **kw)
    return tmp_path / "model", model


def test_sharded_export_round_trips(tmp_path: Path) -> None:
    folder, model = exported(tmp_path, max_shard_bytes=20_000)
    index = json.loads((folder / INDEX).read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and not (folder / "model.safetensors").exists()
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in index["weight_map"]
    loaded = load_hf_folder(folder)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS, POS), model(IDS, POS), rtol=0, atol=0)


def test_sharded_folder_loads_in_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder, model = exported(tmp_path, max_shard_bytes=20_000)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(
            reference.eval()(input_ids=IDS).logits, model(IDS, POS), rtol=0, atol=1e-5
        )


def test_missing_expert_tensor_is_named(tmp_path: Path) -> None:
    folder, _ = exported(tmp_path)
    state = load_file(folder / "model.safetensors")
    del state["model.layers.1.mlp.experts.2.up_proj.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(
        WeightMismatch, match=r"missing tensor model\.layers\.1\.mlp\.experts\.2\.up_proj"
    ):
        load_hf_folder(folder)


def test_missing_dense_tensor_is_named(tmp_path: Path) -> None:
    folder, _ = exported(tmp_path)
    state = load_file(folder / "model.safetensors")
    del state["model.layers.0.self_attn.k_norm.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(WeightMismatch, match=r"missing tensor model\.layers\.0\.self_attn\.k_norm"):
        load_hf_folder(folder)


def test_shape_mismatch_is_named(tmp_path: Path) -> None:
    folder, _ = exported(tmp_path)
    state = load_file(folder / "model.safetensors")
    state["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(16, 32)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(
        WeightMismatch, match=r"model\.layers\.1\.self_attn\.q_proj\.weight has shape \(16, 32\)"
    ):
        load_hf_folder(folder)


def test_unknown_architecture_names_it_and_the_supported_list(tmp_path: Path) -> None:
    folder, _ = exported(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["MambaForCausalLM"], model_type="mamba")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitecture, match=f"'MambaForCausalLM'; {SUPPORTED}"):
        load_hf_folder(folder, impl="custom")


def test_shard_named_by_the_index_but_absent_is_named(tmp_path: Path) -> None:
    folder, _ = exported(tmp_path, max_shard_bytes=20_000)
    victim = sorted(folder.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(ModelFolderError, match=victim.name):
        load_hf_folder(folder)


def test_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match=r"config\.json"):
        load_hf_folder(tmp_path)


def test_hf_impl_runs_transformers_with_the_same_logits_and_names(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder, model = exported(tmp_path)
    hf = load_hf_folder(folder, impl="hf")
    assert isinstance(hf, HFCausalLM)
    assert set(publishable_state_dict(hf)) == set(publishable_state_dict(model))
    lengths = torch.tensor([2, 4])
    packed_pos = torch.tensor([[0, 1, 0, 1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(hf(IDS, POS), model(IDS, POS), rtol=0, atol=1e-5)
        torch.testing.assert_close(
            hf(IDS, packed_pos, sample_lengths=lengths),
            model(IDS, packed_pos, sample_lengths=lengths),
            rtol=0,
            atol=1e-5,
        )


def test_auto_impl_prefers_ours_and_falls_back_to_transformers(
    tmp_path: Path, hf_model: Callable[..., Any]
) -> None:
    transformers = pytest.importorskip("transformers")
    folder, _ = exported(tmp_path)
    assert isinstance(load_hf_folder(folder, impl="auto"), DecoderLM)
    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=32,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "mistral")
    fallback = load_hf_folder(tmp_path / "mistral", impl="auto")
    assert isinstance(fallback, HFCausalLM) and fallback.args.n_kv_heads == 2
    assert fallback(IDS % 64, POS).shape == (1, 6, 64)


def test_writing_over_a_previous_model_folder_replaces_it(tmp_path: Path) -> None:
    out = tmp_path / "export"
    write_folder(out, {"model_type": "llama"}, {"w": torch.zeros(2)}, extra_files={"old": b"x"})
    write_folder(out, {"model_type": "llama"}, {"w": torch.ones(2)})
    assert not (out / "old").exists()
    assert torch.equal(load_file(out / "model.safetensors")["w"], torch.ones(2))


def test_the_folder_written_to_disk_holds_the_files_published_from_memory(tmp_path: Path) -> None:
    config, state = {"model_type": "llama", "vocab_size": 3}, {"w": torch.randn(2, 3)}
    extra = {"generation_config.json": b"{}", "tokenizer.json": b'{"model": {}}'}
    write_folder(tmp_path / "out", config, state, extra_files=extra)
    on_disk = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    published = folder_files(config, state, extra_files=extra)
    assert on_disk == {name: bytes(data) for name, data in published.items()}
    assert read_config(tmp_path / "out") == config


def test_config_alone_is_written_for_an_architecture_without_weights(tmp_path: Path) -> None:
    write_config(tmp_path, {"model_type": "qwen3", "hidden_size": 8})
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    assert read_config(tmp_path) == {"model_type": "qwen3", "hidden_size": 8}


@pytest.mark.parametrize("holds", ["a folder", "no config.json"])
def test_a_folder_that_is_not_a_model_folder_is_never_replaced(tmp_path: Path, holds: str) -> None:
    out = tmp_path / "home"
    (out / "documents").mkdir(parents=True)
    (out / "documents" / "sentinel.txt").write_text("mine")
    if holds == "no config.json":
        out = out / "documents"
    with pytest.raises(ModelFolderError, match="refusing to replace"):
        write_folder(out, {"model_type": "llama"}, {"w": torch.zeros(2)})
    assert (tmp_path / "home" / "documents" / "sentinel.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["home"]  # no temp folder left behind
