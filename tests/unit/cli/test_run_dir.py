"""`tidal rl` and the run folder: an existing folder is never replaced silently, only
`--overwrite` replaces it, `--resume` keeps it, and nothing outside `run.output_dir` is
ever touched.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import prepare_run_dir
from tidal.cli.main import main
from tidal.common.config.loading import load_config
from tidal.common.errors import ConfigError
from tidal.common.files.modes import apply_file_policy

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]


def run_config(output_dir: Path, *extra: str) -> RunConfig:
    argv = [*DEFAULT, "--run.output-dir", str(output_dir), "--run.name", "r", *extra]
    return load_config(RunConfig, argv, environ={})[0]


def run_main(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0)


def old_run(output_dir: Path) -> Path:
    run_dir = output_dir / "r"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "old.txt").write_text("keep me unless --overwrite")
    return run_dir


def test_an_existing_run_folder_is_refused_naming_both_options(tmp_path: Path) -> None:
    old = old_run(tmp_path)
    with pytest.raises(ConfigError) as err:
        prepare_run_dir(run_config(tmp_path))
    assert "--resume" in str(err.value) and "--overwrite" in str(err.value)
    assert (old / "checkpoints" / "old.txt").is_file()


def test_the_cli_refuses_an_existing_run_folder_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = old_run(tmp_path)
    argv = ["rl", *DEFAULT, "--run.output-dir", str(tmp_path), "--run.name", "r"]
    assert run_main(argv) == 2
    assert "already exists" in capsys.readouterr().err
    assert (old / "checkpoints" / "old.txt").is_file()
    assert not (old / "config.toml").exists()


def test_overwrite_replaces_the_run_folder(tmp_path: Path) -> None:
    old = old_run(tmp_path)
    run_dir = prepare_run_dir(run_config(tmp_path), overwrite=True)
    assert run_dir == old
    assert not (old / "checkpoints").exists()
    assert (run_dir / "config.toml").is_file() and (run_dir / "logs").is_dir()


def test_resume_keeps_the_run_folder_and_its_checkpoints(tmp_path: Path) -> None:
    old = old_run(tmp_path)
    (old / "checkpoints" / "step_00000004").mkdir()
    (old / "checkpoints" / "step_00000004" / ".metadata").write_bytes(b"dcp")
    run_dir = prepare_run_dir(run_config(tmp_path), resume=True)
    assert (run_dir / "checkpoints" / "old.txt").is_file()
    assert (run_dir / "config.toml").is_file()
    assert (run_dir / "logs").is_dir()


def test_resume_without_a_trainer_checkpoint_is_refused_saying_why(tmp_path: Path) -> None:
    old = old_run(tmp_path)
    with pytest.raises(ConfigError, match="no complete trainer checkpoint"):
        prepare_run_dir(run_config(tmp_path), resume=True)
    assert (old / "checkpoints" / "old.txt").is_file()


def test_resume_of_a_missing_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no run folder"):
        prepare_run_dir(run_config(tmp_path), resume=True)


@pytest.mark.parametrize("name", ["../x", "..", "a/b", ".hidden", "/abs", "a\\b", "", "x" * 129])
def test_a_run_name_that_is_not_a_plain_folder_name_is_refused(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    sentinel = tmp_path / "x" / "sentinel.txt"  # where `../x` would point
    sentinel.parent.mkdir()
    sentinel.write_text("outside outputs")
    argv = ["rl", *DEFAULT, "--run.output-dir", str(outputs), "--run.name", name, "--overwrite"]
    assert run_main(argv) == 2
    assert "run.name" in capsys.readouterr().err
    assert sentinel.read_text() == "outside outputs"
    assert list(outputs.iterdir()) == []


def test_a_shared_readable_run_folder_is_readable_but_its_keys_are_not(tmp_path: Path) -> None:
    config = run_config(tmp_path, "--run.shared-readable", "true")
    apply_file_policy(shared_readable=config.run.shared_readable)  # as `tidal rl` does first
    run_dir = prepare_run_dir(config)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [run_dir, *run_dir.rglob("*")]}
    assert modes["r"] == modes["logs"] == 0o755
    assert modes["config.toml"] == modes["ca.pem"] == 0o644
    assert modes["tls"] == 0o700 and modes["trainer.key"] == 0o600


def test_a_private_run_folder_is_its_users_only(tmp_path: Path) -> None:
    config = run_config(tmp_path)
    apply_file_policy(shared_readable=config.run.shared_readable)
    run_dir = prepare_run_dir(config)
    for path in [run_dir, *run_dir.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
