"""`tidal rl`: flags without values, and --help listing every key a user can set."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]


def exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0)


def test_rl_flag_without_value_fails_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", *DEFAULT, "--trainer.optim.lr", "--dry-run"]) == 2
    assert "--trainer.optim.lr needs a value" in capsys.readouterr().err


def test_rl_flag_before_dry_run_is_not_given_true(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", *DEFAULT, "--orchestrator.steps", "--dry-run"]) == 2
    assert "--orchestrator.steps needs a value" in capsys.readouterr().err


def test_rl_bare_boolean_flag_sets_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", *DEFAULT, "--orchestrator.resume", "--dry-run"]) == 0
    assert "resume = true" in capsys.readouterr().out


def test_rl_help_lists_optional_and_tagged_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--trainer.model.lora.rank " in out
    assert "--orchestrator.task.alphabet " in out and "--orchestrator.task.num_numbers " in out
    assert "--weightsync.transport.replicas " in out


def test_rl_help_shows_toml_values_not_python_reprs(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", "--help"]) == 0
    out = capsys.readouterr().out
    assert '--run.output_dir (default: "outputs")' in out
    assert "PosixPath" not in out and "TaskConfig(" not in out and "PydanticUndefined" not in out
