"""Starting from a Hugging Face folder: `[trainer.model]` takes the folder's architecture
(filled in, so configs, logs and `--dry-run` name the real model), refuses a key that
contradicts it, and the run's tokenizer must fit the model's embedding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tidal.trainer.config import ModelConfig, SftRunConfig, TrainerRunConfig

from ...hf_folders import build_model_folder, qwen3_folder

__all__ = ["qwen3_folder"]


def folder_config(folder: Path) -> dict[str, object]:
    return json.loads((folder / "config.json").read_text())


def test_the_folder_fills_in_the_architecture(qwen3_folder: Path) -> None:
    hf = folder_config(qwen3_folder)
    model = ModelConfig(path=qwen3_folder)
    assert model.family == "qwen3"
    assert (model.dim, model.n_layers, model.n_heads, model.n_kv_heads) == (
        hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"],
        hf["num_key_value_heads"],
    )  # fmt: skip
    assert model.head_dim == hf["head_dim"] and model.vocab_size == hf["vocab_size"]
    assert model.tie_embeddings is hf["tie_word_embeddings"]


def test_a_key_equal_to_the_folders_value_is_accepted(qwen3_folder: Path) -> None:
    filled = ModelConfig(path=qwen3_folder)
    again = ModelConfig.model_validate(filled.model_dump(mode="json"))  # every key set
    assert again == filled


def test_a_key_that_contradicts_the_folder_names_both_values(qwen3_folder: Path) -> None:
    dim = folder_config(qwen3_folder)["hidden_size"]
    with pytest.raises(ValidationError) as refused:
        ModelConfig(path=qwen3_folder, dim=dim + 32)
    message = str(refused.value)
    assert f"trainer.model.dim = {dim + 32}" in message and f"says {dim}" in message
    assert "remove trainer.model.dim" in message


def test_a_moe_key_on_a_dense_folder_is_refused(qwen3_folder: Path) -> None:
    with pytest.raises(ValidationError, match=r"n_experts = 16 does not apply"):
        ModelConfig(path=qwen3_folder, n_experts=16)


def test_a_folder_without_config_json_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"config\.json not found.*download the model"):
        ModelConfig(path=tmp_path)


def test_a_model_vocabulary_below_the_byte_tokenizers_names_both_sizes() -> None:
    """It used to pass validation and die in the first forward with an IndexError."""
    with pytest.raises(ValidationError) as refused:
        TrainerRunConfig.model_validate({"trainer": {"model": {"vocab_size": 200}}})
    message = str(refused.value)
    assert "259 ids" in message and "only 200 rows" in message
    assert "vocab_size to at least 259" in message


def test_a_tokenizer_larger_than_the_folders_embedding_is_refused(
    qwen3_folder: Path, tmp_path: Path
) -> None:
    small = build_model_folder(tmp_path / "small", "qwen3", weights=False)
    (small / "config.json").write_text(
        json.dumps({**folder_config(qwen3_folder), "vocab_size": 300})
    )
    tokens = len(json.loads((small / "tokenizer.json").read_text())["model"]["vocab"])
    with pytest.raises(ValidationError, match=r"only 300 rows"):
        SftRunConfig.model_validate({"trainer": {"model": {"path": str(small)}}})
    assert tokens > 300


def test_the_folders_tokenizer_fits_its_own_model(qwen3_folder: Path) -> None:
    config = TrainerRunConfig.model_validate({"trainer": {"model": {"path": str(qwen3_folder)}}})
    assert config.trainer.model.family == "qwen3"


def test_the_trainer_describes_the_folders_model(qwen3_folder: Path) -> None:
    """Logs and GetStatus used to say "llama ... (dim 128 ...)" for any folder."""
    import torch

    from tidal.trainer.config import TrainerConfig
    from tidal.trainer.train_step import Trainer

    hf = folder_config(qwen3_folder)
    trainer = Trainer(
        TrainerConfig(model=ModelConfig(path=qwen3_folder)), seed=0, device=torch.device("cpu")
    )
    line = trainer.describe()
    assert line.startswith("qwen3 ") and f"dim {hf['hidden_size']}" in line
    assert f"vocab {hf['vocab_size']}" in line
