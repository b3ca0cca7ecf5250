"""`tidal rl` serves a distillation teacher folder: one more inference child serving it as a
fixed version on a free loopback gRPC address, which the orchestrator's config names; no
teacher folder, no child."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import child_specs, prepare_run_dir
from tidal.common.config.loading import load_config
from tidal.common.errors import ConfigError
from tidal.inference.config import InferenceRunConfig

ROOT = Path(__file__).resolve().parents[3]


def run_config(tmp_path: Path, *flags: str) -> RunConfig:
    argv = ["@", str(ROOT / "configs" / "default.toml"), "--run.output-dir", str(tmp_path)]
    return load_config(RunConfig, [*argv, *flags], environ={})[0]


def teacher_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "teacher"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # what the launcher checks; the child loads it
    return folder


def test_the_teacher_child_serves_its_folder_where_the_orchestrator_looks(tmp_path: Path) -> None:
    folder = teacher_folder(tmp_path)
    config = run_config(tmp_path, "--orchestrator.distill.model-path", str(folder))
    run_dir = prepare_run_dir(config)
    written = tomllib.loads((run_dir / "config.toml").read_text())["orchestrator"]["distill"]
    assert written["address"].startswith("127.0.0.1:")
    [teacher] = [s for s in child_specs(config) if s.name == "teacher"]
    assert teacher.module == "tidal.inference" and teacher.args == teacher.restart_args
    child = load_config(InferenceRunConfig, ["@", str(run_dir / "config.toml"), *teacher.args],
                        environ={})[0]  # fmt: skip
    assert child.inference.model_path == folder
    assert child.endpoints.inference == written["address"] != config.endpoints.inference
    assert not child.inference.http.enabled
    names = [s.name for s in child_specs(config)]
    assert names.index("teacher") < names.index("orchestrator")


def test_without_a_teacher_folder_no_teacher_child_starts(tmp_path: Path) -> None:
    config = run_config(tmp_path)
    prepare_run_dir(config)
    assert "teacher" not in [s.name for s in child_specs(config)]


def test_a_teacher_folder_without_config_is_refused_naming_the_key(tmp_path: Path) -> None:
    config = run_config(tmp_path, "--orchestrator.distill.model-path", str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"orchestrator\.distill\.model_path .* \(no config\.json\)"
    ):
        prepare_run_dir(config)
