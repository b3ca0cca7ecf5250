"""`tidal plan --help [SECTION]` and its own flags: the flags it accepts, spelt as typed."""

from __future__ import annotations

import pytest

from tidal.cli.memory_plan import main, split_plan_args
from tidal.common.config.loading import ConfigError


def plan_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_help_names_the_json_flag_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_help(capsys)
    assert "--json " in out and "--json-output" not in out


def test_help_shows_memory_as_required(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_help(capsys)
    assert "--memory (required)" in out and "PydanticUndefined" not in out


def test_help_shows_defaults_as_toml_values(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_help(capsys)
    assert '--device (default: "cuda")' in out and "'cuda'" not in out


def test_help_section_lists_the_run_config_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--memory", "80GiB", "--help", "trainer.model.lora"])
    assert exit_.value.code == 0
    assert "--trainer.model.lora.rank (" in capsys.readouterr().out


def test_memory_followed_by_a_flag_has_no_value() -> None:
    with pytest.raises(ConfigError, match="--memory needs a value"):
        split_plan_args(["--memory", "--fit"])
