"""Config composition: files left to right, env, CLI flags; unknown keys; dry run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.common.config.loading import (
    BaseConfig,
    ConfigError,
    load_config,
    load_or_exit,
    split_argv,
)


class Optim(BaseConfig):
    lr: float = 1e-3
    """Learning rate."""
    betas: list[float] = [0.9, 0.999]
    """Adam betas."""


class Trainer(BaseConfig):
    optim: Optim = Optim()
    max_steps: int = 10
    """Steps to train."""


class Run(BaseConfig):
    name: str = "default"
    """Run name."""
    verbose: bool = False
    """Log more."""
    trainer: Trainer = Trainer()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_files_compose_left_to_right(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", 'name = "a"\n[trainer]\nmax_steps = 5\n')
    b = write(tmp_path, "b.toml", "[trainer.optim]\nlr = 0.5\n")
    c = write(tmp_path, "c.toml", 'name = "c"\n')
    config, _ = load_config(Run, ["@", a, f"@{b}", "@", c], environ={})
    assert (config.name, config.trainer.max_steps, config.trainer.optim.lr) == ("c", 5, 0.5)


def test_cli_overrides_kebab_case_and_literals(tmp_path: Path) -> None:
    argv = [
        "--trainer.max-steps",
        "7",
        "--trainer.optim.lr=1e-5",
        "--trainer.optim.betas",
        "[0.8, 0.9]",
    ]
    config, _ = load_config(Run, argv, environ={})
    assert config.trainer.max_steps == 7
    assert config.trainer.optim.lr == pytest.approx(1e-5)
    assert config.trainer.optim.betas == [0.8, 0.9]


def test_env_overrides_files_and_cli_overrides_env(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "[trainer]\nmax_steps = 5\n")
    env = {"TIDAL_TRAINER__MAX_STEPS": "6", "TIDAL_NAME": "ignored-no-section-separator"}
    config, _ = load_config(Run, ["@", a], environ=env)
    assert config.trainer.max_steps == 6
    config, _ = load_config(Run, ["@", a, "--trainer.max-steps", "8"], environ=env)
    assert config.trainer.max_steps == 8


def test_unknown_nested_key_names_path_and_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(Run, ["--trainer.optim.lrr", "1"], environ={})
    assert "unknown key 'trainer.optim.lrr'" in str(err.value)
    assert "did you mean 'trainer.optim.lr'" in str(err.value)


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "[trainer]\nzzz = 1\n")
    with pytest.raises(ConfigError, match=r"valid keys here: max_steps, optim"):
        load_config(Run, ["@", a], environ={})


def test_bad_value_names_key() -> None:
    with pytest.raises(ConfigError, match=r"'trainer\.max_steps'"):
        load_config(Run, ["--trainer.max-steps", "many"], environ={})


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Run, ["@", str(tmp_path / "nope.toml")], environ={})


def test_stray_argument_is_rejected() -> None:
    with pytest.raises(ConfigError, match="unexpected argument"):
        split_argv(["config.toml"])


def test_flag_without_value_is_an_error_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--trainer\.optim\.lr needs a value"):
        load_config(Run, ["--trainer.optim.lr"], environ={})


def test_flag_followed_by_another_flag_has_no_value() -> None:
    with pytest.raises(ConfigError, match=r"--trainer\.max-steps needs a value"):
        load_config(Run, ["--trainer.max-steps", "--name", "x"], environ={})


def test_bare_boolean_flag_means_true() -> None:
    config, _ = load_config(Run, ["--verbose", "--name", "x"], environ={})
    assert config.verbose is True and config.name == "x"


def test_bare_flag_of_an_unknown_key_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'verbose'"):
        load_config(Run, ["--verbos"], environ={})


def test_dry_run_prints_resolved_toml(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        load_or_exit(Run, ["--name", "x", "--dry-run"], usage="test")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert 'name = "x"' in out and "[trainer.optim]" in out and "lr = 0.001" in out


def test_help_all_lists_fields_with_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_or_exit(Run, ["--help", "all"], usage="test")
    out = capsys.readouterr().out
    assert "--trainer.optim.lr" in out and "Learning rate." in out


@pytest.mark.parametrize("argv", [["--help", "trainer.optim"], ["--help=trainer.optim"]])
def test_help_takes_a_section(argv: list[str]) -> None:
    assert split_argv(argv).help == "trainer.optim"


def test_help_before_a_flag_or_file_takes_no_section() -> None:
    parsed = split_argv(["--help", "--name", "x", "-h", "@", "a.toml"])
    assert parsed.help == "" and parsed.overrides == [("name", "x")]


def test_help_of_an_unknown_section_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        load_or_exit(Run, ["--help", "trainer.optm"], usage="test")
    assert exit_.value.code == 2
    assert "did you mean 'trainer.optim'?" in capsys.readouterr().err


def test_bad_key_exits_2_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        load_or_exit(Run, ["--nmae", "x"], usage="test")
    assert exit_.value.code == 2
    assert "did you mean 'name'" in capsys.readouterr().err
