"""Complete exports: `tidal export` of a trained checkpoint (started from a Qwen3-style
folder) and every published version are Hugging Face folders that `transformers` loads
with our logits and the source folder's tokenization.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.trainer.export import ExportRunConfig, export_run, main
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.persistence.hf_folder_files import run_hf_folder_files
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.trainer.train_step import Trainer
from tidal.weights.folder import version_dir
from tidal.weights.manifest import MANIFEST_FILE, WeightManifest
from tidal.weights.transports.filesystem import FilesystemSender

from ...hf_folders import qwen3_folder
from .conftest import batches_for

__all__ = ["qwen3_folder"]

transformers = pytest.importorskip("transformers")
TEXTS = ["Hello, world! The answer is 42.", "東京は日本の首都です。", "<think>\nok\n</think>"]
CHAT = [{"role": "user", "content": "What is 12 + 30?"}]


def run_config(folder: Path, out: Path, **export: Any) -> ExportRunConfig:
    return ExportRunConfig.model_validate(
        {
            "run": {"output_dir": str(out), "name": "r"},
            "trainer": {"model": {"path": str(folder)}},
            "export": export,
        }
    )


@pytest.fixture(scope="module")
def trained(
    qwen3_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ExportRunConfig, Trainer]:
    """A trainer started from the folder, one step trained and checkpointed."""
    config = run_config(qwen3_folder, tmp_path_factory.mktemp("run"))
    trainer = Trainer(config.trainer, seed=0, device=torch.device("cpu"))
    trainer.train_step(1, batches_for(1), "pg")
    CheckpointManager(config.checkpoint_dir, keep_last=1).save(trainer)
    return config, trainer


def reference_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits.float()


def test_an_exported_checkpoint_loads_in_transformers_with_our_logits(
    trained: tuple[ExportRunConfig, Trainer],
) -> None:
    config, trainer = trained
    out = export_run(config)
    ids = torch.tensor([[5, 120, 7, 300, 44, 9]])
    with torch.no_grad():
        ours = trainer.model(ids, torch.arange(ids.shape[1])[None])
    torch.testing.assert_close(reference_logits(out, ids), ours, rtol=1e-5, atol=1e-5)


def test_an_export_tokenizes_as_the_source_folder(
    trained: tuple[ExportRunConfig, Trainer], qwen3_folder: Path
) -> None:
    out = export_run(trained[0])
    exported = transformers.AutoTokenizer.from_pretrained(out)
    source = transformers.AutoTokenizer.from_pretrained(qwen3_folder)
    for text in TEXTS:
        assert exported(text)["input_ids"] == source(text)["input_ids"]
    rendered = exported.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == source.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


def test_an_export_names_the_tokenizers_ids(
    trained: tuple[ExportRunConfig, Trainer], qwen3_folder: Path
) -> None:
    out = export_run(trained[0])
    source = transformers.AutoTokenizer.from_pretrained(qwen3_folder)
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == source.eos_token_id
    assert config["pad_token_id"] == source.pad_token_id and config["bos_token_id"] is None
    generation = transformers.GenerationConfig.from_pretrained(out)
    source_eos = json.loads((qwen3_folder / "generation_config.json").read_text())["eos_token_id"]
    assert set(source_eos) <= set(generation.eos_token_id)


def test_a_published_version_is_the_same_complete_folder(
    trained: tuple[ExportRunConfig, Trainer], tmp_path: Path
) -> None:
    config, trainer = trained
    folder_files = run_hf_folder_files(config.run.tokenizer, config.model_folder())
    publisher = WeightPublisher(
        tmp_path, client=None, hf_config=folder_files.config(trainer.hf_config()),  # type: ignore[arg-type]
        files=folder_files.files,
    )  # fmt: skip
    manifest = FilesystemSender(tmp_path, client=None).write(  # type: ignore[arg-type]
        publisher.payload(1, trainer.state_dict_for_publish())
    )
    version = version_dir(tmp_path, 1)
    export = export_run(config)
    published = {p.name for p in version.iterdir()} - {MANIFEST_FILE}
    assert published == {p.name for p in export.iterdir()}
    assert {f.path for f in manifest.files} == published  # every file hashed and verified
    assert json.loads((version / "config.json").read_text()) == json.loads(
        (export / "config.json").read_text()
    )
    ids = torch.tensor([[5, 120, 7, 300]])
    torch.testing.assert_close(reference_logits(version, ids), reference_logits(export, ids))


def test_a_bf16_version_says_so_in_its_config_and_loads_in_transformers(
    trained: tuple[ExportRunConfig, Trainer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainer.publish_dtype` bfloat16 (what "auto" picks for a bf16 step): half the bytes,
    config.json's torch_dtype names it, and Hugging Face loads the folder as it is."""
    config, trainer = trained
    monkeypatch.setattr(trainer, "publish_dtype", torch.bfloat16)
    folder_files = run_hf_folder_files(config.run.tokenizer, config.model_folder())
    publisher = WeightPublisher(
        tmp_path, client=None, hf_config=folder_files.config(trainer.hf_config()),  # type: ignore[arg-type]
        files=folder_files.files,
    )  # fmt: skip
    FilesystemSender(tmp_path, client=None).write(  # type: ignore[arg-type]
        publisher.payload(1, trainer.state_dict_for_publish())
    )
    version = version_dir(tmp_path, 1)
    assert json.loads((version / "config.json").read_text())["torch_dtype"] == "bfloat16"
    export = export_run(config)
    assert json.loads((export / "config.json").read_text())["torch_dtype"] == "float32"
    ids = torch.tensor([[5, 120, 7, 300]])
    torch.testing.assert_close(
        reference_logits(version, ids).float(), reference_logits(export, ids), rtol=0, atol=5e-2
    )


def test_export_from_a_version_writes_the_same_weights(
    trained: tuple[ExportRunConfig, Trainer], tmp_path: Path
) -> None:
    config, trainer = trained
    root = config.publish_dir
    folder_files = run_hf_folder_files(config.run.tokenizer, config.model_folder())
    payload = WeightPublisher(
        root, client=None, hf_config=folder_files.config(trainer.hf_config()),  # type: ignore[arg-type]
        files=folder_files.files,
    ).payload(3, trainer.state_dict_for_publish())  # fmt: skip
    FilesystemSender(root, client=None).write(payload)  # type: ignore[arg-type]
    assert WeightManifest.read(version_dir(root, 3)).version == 3
    main(["--run.output-dir", str(config.run.output_dir), "--run.name", "r",
          "--trainer.model.path", str(config.model_folder()), "--export.version", "3",
          "--export.out", str(tmp_path / "v3")])  # fmt: skip
    ids = torch.tensor([[5, 120, 7, 300]])
    with torch.no_grad():
        ours = trainer.model(ids, torch.arange(4)[None])
    torch.testing.assert_close(reference_logits(tmp_path / "v3", ids), ours, rtol=1e-5, atol=1e-5)


def test_nothing_to_export_says_where_it_looked(qwen3_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--run.output-dir", str(tmp_path), "--trainer.model.path", str(qwen3_folder)])
    assert exit_.value.code == 2


def test_an_output_folder_that_is_not_a_model_folder_is_refused_untouched(
    qwen3_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "somewhere"
    (out / "keep").mkdir(parents=True)
    argv = ["--run.output-dir", str(tmp_path), "--trainer.model.path", str(qwen3_folder)]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--export.out", str(out)])
    assert exit_.value.code == 2
    assert "export.out" in capsys.readouterr().err
    assert (out / "keep").is_dir()
