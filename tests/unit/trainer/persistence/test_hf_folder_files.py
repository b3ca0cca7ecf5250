"""Every special-token id a model folder declares survives into published versions and
`tidal export`, and the tokenizer fills only what the folder leaves unset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.text.byte import ByteTokenizer
from tidal.trainer.export import ExportRunConfig, export_run
from tidal.trainer.persistence.hf_folder_files import hf_folder_files, run_hf_folder_files
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.trainer.train_step import Trainer
from tidal.weights.folder import version_dir
from tidal.weights.transports.filesystem import FilesystemSender

from ....hf_folders import build_model_folder, declare_token_ids

Declared = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def declaring_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Declared]:
    folder = build_model_folder(tmp_path_factory.mktemp("declared") / "model", "qwen3")
    return folder, declare_token_ids(folder)


def publish(config: ExportRunConfig, version: int) -> Path:
    """Version `version` of a trainer started from the run's folder, as the trainer publishes."""
    trainer = Trainer(config.trainer, seed=0, device=torch.device("cpu"))
    files = run_hf_folder_files(config.run.tokenizer, config.model_folder())
    publisher = WeightPublisher(
        config.publish_dir, client=None, hf_config=files.config(trainer.hf_config()),  # type: ignore[arg-type]
        files=files.files,
    )  # fmt: skip
    FilesystemSender(config.publish_dir, client=None).write(  # type: ignore[arg-type]
        publisher.payload(version, trainer.state_dict_for_publish())
    )
    return version_dir(config.publish_dir, version)


def assert_declared(folder: Path, declared: Declared) -> None:
    for name, ids in declared.items():
        written = json.loads((folder / name).read_text())
        assert {k: written.get(k) for k in ids} == ids, name


def test_a_published_version_and_an_export_keep_every_declared_token_id(
    declaring_folder: tuple[Path, Declared], tmp_path: Path
) -> None:
    folder, declared = declaring_folder
    config = ExportRunConfig.model_validate(
        {"run": {"output_dir": str(tmp_path), "name": "r"},
         "trainer": {"model": {"path": str(folder)}}}
    )  # fmt: skip
    assert_declared(publish(config, 1), declared)
    assert_declared(export_run(config), declared)


def test_generation_eos_gains_the_tokenizers_end_of_turn_ids_after_the_declared_ones(
    declaring_folder: tuple[Path, Declared], tmp_path: Path
) -> None:
    folder, _ = declaring_folder
    generation = json.loads((folder / "generation_config.json").read_text())
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    (tmp_path / "generation_config.json").write_text(
        json.dumps({**generation, "eos_token_id": 7, "bos_token_id": None})
    )
    files = hf_folder_files(ByteTokenizer(), source=tmp_path)
    written = json.loads(files.files["generation_config.json"])
    byte_eos = ByteTokenizer().eos_id
    assert written["eos_token_id"] == [7, byte_eos]
    assert written["bos_token_id"] == files.token_ids["bos_token_id"]  # config.json's
    assert written["temperature"] == generation["temperature"]


def test_without_a_source_folder_the_ids_are_the_tokenizers() -> None:
    tokenizer = ByteTokenizer()
    files = hf_folder_files(tokenizer)
    assert files.token_ids == {
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
    }
    written = json.loads(files.files["generation_config.json"])
    assert written == {**files.token_ids, "eos_token_id": tokenizer.eos_id}
