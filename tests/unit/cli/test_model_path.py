"""`tidal rl` with `trainer.model.path`: the folder's architecture reaches `--dry-run` and
the config the launcher writes, that file re-runs, and a model smaller than the run's
tokenizer is refused before anything starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import prepare_run_dir
from tidal.cli.main import main
from tidal.common.config.loading import load_config
from tidal.inference.config import InferenceRunConfig
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.trainer.config import TrainerRunConfig
from tidal.weightsync.config import WeightSyncRunConfig

from ...hf_folders import qwen3_folder

__all__ = ["qwen3_folder"]

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]


def run_main(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0)


def test_dry_run_shows_the_folders_family_and_sizes(
    qwen3_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["rl", *DEFAULT, "--trainer.model.path", str(qwen3_folder), "--dry-run"]
    assert run_main(argv) == 0, capsys.readouterr().err
    model = tomllib.loads(capsys.readouterr().out)["trainer"]["model"]
    hf = json.loads((qwen3_folder / "config.json").read_text())
    assert model["family"] == "qwen3"
    assert (model["dim"], model["n_layers"], model["vocab_size"]) == (
        hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"],
    )  # fmt: skip


def test_the_written_config_re_runs_in_the_launcher_and_every_service(
    qwen3_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*DEFAULT, "--trainer.model.path", str(qwen3_folder), "--run.output-dir", str(tmp_path)]
    config, _ = load_config(RunConfig, argv, environ={})
    written = prepare_run_dir(config) / "config.toml"
    again, _ = load_config(RunConfig, ["@", str(written)], environ={})
    assert again.trainer == config.trainer
    trainer, _ = load_config(TrainerRunConfig, ["@", str(written)], environ={})
    assert trainer.trainer.model.family == "qwen3"
    for service in (InferenceRunConfig, OrchestratorRunConfig, WeightSyncRunConfig):
        assert load_config(service, ["@", str(written)], environ={})[0].model_folder() == (
            qwen3_folder
        )
    assert run_main(["rl", "@", str(written), "--dry-run"]) == 0, capsys.readouterr().err


def test_a_model_vocabulary_below_the_tokenizers_fails_naming_both_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_main(["rl", *DEFAULT, "--trainer.model.vocab-size", "200", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "259 ids" in err and "only 200 rows" in err


def test_a_key_contradicting_the_folder_fails_naming_it(
    qwen3_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["rl", *DEFAULT, "--trainer.model.path", str(qwen3_folder)]
    assert run_main([*argv, "--trainer.model.family", "llama", "--dry-run"]) == 2
    assert "trainer.model.family = 'llama'" in capsys.readouterr().err


def test_reading_the_folder_at_validation_imports_no_torch(qwen3_folder: Path) -> None:
    """`--dry-run` and `--help` stay instant: the folder is read torch-free."""
    code = (
        "import sys, contextlib, io\n"
        "from tidal.cli.main import main\n"
        "try:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        f"        main(['rl', '@', {DEFAULT[1]!r}, '--trainer.model.path', {str(qwen3_folder)!r},"
        " '--dry-run'])\n"
        "except SystemExit as exit_:\n"
        "    print(exit_.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "0 False", done.stderr


def test_a_gguf_file_as_the_model_path_fails_pointing_at_import_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    assert run_main(["rl", *DEFAULT, "--trainer.model.path", str(gguf), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a model folder" in err
    assert f"tidal import-model {gguf} --out DIR" in err
