"""`[orchestrator]` is grouped into sections; the old flat keys fail naming the new ones
and the date after which they are plain unknown keys."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.common.config.loading import ConfigError, load_config
from tidal.orchestrator.config import MOVED_KEYS, OrchestratorConfig, OrchestratorRunConfig


def _error(cls: type, args: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(cls, args, environ={})
    return str(err.value)


def test_an_old_flat_flag_fails_naming_the_new_key() -> None:
    message = _error(RunConfig, ["--orchestrator.max_async", "2"])
    assert "unknown key 'orchestrator.max_async'" in message
    assert "replaced by 'orchestrator.staleness.max_async'" in message


def test_an_old_kebab_case_flag_fails_naming_the_new_key() -> None:
    message = _error(RunConfig, ["--orchestrator.data-parallel-ranks", "2"])
    assert "replaced by 'orchestrator.packing.data_parallel_ranks'" in message


def test_an_old_flat_key_in_a_toml_file_fails_naming_the_new_key(tmp_path: Path) -> None:
    old = tmp_path / "old.toml"
    old.write_text("[orchestrator]\nsteps = 3\nmax_async = 2\n")
    message = _error(RunConfig, ["@", str(old)])
    assert "unknown key 'orchestrator.max_async'" in message
    assert "replaced by 'orchestrator.staleness.max_async'" in message


def test_the_orchestrator_alone_names_the_new_key_too() -> None:
    message = _error(OrchestratorRunConfig, ["--orchestrator.peer-wait-s", "5"])
    assert "replaced by 'orchestrator.timeouts.peer_wait_s'" in message


def test_a_moved_key_error_says_the_key_moved_and_when_the_pointer_goes() -> None:
    message = _error(RunConfig, ["--orchestrator.table-every", "3"])
    assert "the key moved, it was replaced by 'orchestrator.report.table_every'" in message
    assert f"(this pointer is removed after {OrchestratorConfig.moved_keys_until})" in message


def test_the_moved_keys_have_a_removal_date() -> None:
    until = date.fromisoformat(OrchestratorConfig.moved_keys_until)
    assert until > date(2026, 11, 24)  # the day they moved


def test_the_changelog_lists_every_moved_key() -> None:
    changelog = (Path(__file__).resolve().parents[3] / "CHANGELOG.md").read_text()
    for old, new in MOVED_KEYS.items():
        assert f"| `orchestrator.{old}` | `{new}`" in changelog


def test_every_moved_key_points_at_a_field_that_exists() -> None:
    for old, new in MOVED_KEYS.items():
        assert old not in OrchestratorConfig.model_fields
        section, _, key = new.removeprefix("orchestrator.").partition(".")
        section_cls = OrchestratorConfig.model_fields[section].annotation
        assert key in section_cls.model_fields, new  # type: ignore[union-attr]


def test_the_new_keys_load_from_a_toml_file_and_flags(tmp_path: Path) -> None:
    new = tmp_path / "new.toml"
    new.write_text("[orchestrator.staleness]\nmax_async = 2\n")
    config, _ = load_config(
        RunConfig, ["@", str(new), "--orchestrator.timeouts.train-s", "9"], environ={}
    )
    assert config.orchestrator.staleness.max_async == 2
    assert config.orchestrator.staleness.bound == 3
    assert config.orchestrator.timeouts.train_s == 9.0


def test_data_parallel_ranks_is_unset_by_default() -> None:
    assert OrchestratorConfig().packing.data_parallel_ranks is None


def test_rloo_with_one_completion_per_prompt_names_both_keys() -> None:
    with pytest.raises(
        ValueError, match=r"advantages.algorithm rloo needs orchestrator.group_size"
    ):
        OrchestratorConfig(group_size=1, advantages={"algorithm": "rloo"})
