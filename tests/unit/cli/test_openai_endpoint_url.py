"""`tidal rl` with `[inference.http]` enabled: a harness finds the OpenAI endpoint's URL in
the run's config.toml and in the launcher's output; a non-loopback host is refused."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import prepare_run_dir
from tidal.common.config.loading import load_config
from tidal.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]


def test_the_launcher_fixes_the_port_in_config_and_prints_the_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*DEFAULT, "--inference.http.enabled", "true", "--run.output-dir", str(tmp_path)]
    config, _ = load_config(RunConfig, argv, environ={})
    written = tomllib.loads((prepare_run_dir(config) / "config.toml").read_text())
    http = written["inference"]["http"]
    assert http["enabled"] and http["port"] > 0
    assert f"http://127.0.0.1:{http['port']}/v1" in capsys.readouterr().err


def test_a_non_loopback_http_host_fails_before_anything_starts(tmp_path: Path) -> None:
    argv = [*DEFAULT, "--inference.http.host", "0.0.0.0", "--run.output-dir", str(tmp_path)]
    with pytest.raises(ConfigError, match="not a loopback address"):
        load_config(RunConfig, argv, environ={})
