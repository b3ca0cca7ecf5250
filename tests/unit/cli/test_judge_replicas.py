"""`tidal rl` serves a judge that names a model folder: one more inference child per folder,
its OpenAI endpoint on a free loopback port, and every judge naming that folder pointed at
it in the config the services read; an external judge is left as configured."""

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
EXTERNAL = "https://judge.example/v1"


def run_config(tmp_path: Path, *flags: str) -> RunConfig:
    judge = tmp_path / "judge"
    mixture = tmp_path / "mixture.toml"
    mixture.write_text(
        f"""
[[orchestrator.tasks]]
type = "reversal"
[orchestrator.tasks.reward]
type = "judge"
model_path = "{judge}"
model = "grader"

[[orchestrator.tasks]]
type = "arithmetic"
[orchestrator.tasks.reward]
type = "judge"
model_path = "{judge}/."

[[orchestrator.tasks]]
type = "countdown"
[orchestrator.tasks.reward]
type = "judge"
base_url = "{EXTERNAL}"
api_key_env = "JUDGE_KEY"
"""
    )
    judge.mkdir(exist_ok=True)
    (judge / "config.json").write_text("{}")  # what the launcher checks; the child loads it
    argv = ["@", str(ROOT / "configs" / "default.toml"), "@", str(mixture)]
    return load_config(RunConfig, [*argv, "--run.output-dir", str(tmp_path), *flags], environ={})[0]


def test_tasks_naming_one_folder_share_one_judge_replica(tmp_path: Path) -> None:
    config = run_config(tmp_path)
    run_dir = prepare_run_dir(config)
    written = tomllib.loads((run_dir / "config.toml").read_text())
    served, same, external = (t["reward"] for t in written["orchestrator"]["tasks"])
    assert served["base_url"].startswith("http://127.0.0.1:")
    assert same["base_url"] == served["base_url"]
    assert same["model"] == served["model"] == "grader"
    assert same["model_path"] == served["model_path"] == str(tmp_path / "judge")
    assert external["base_url"] == EXTERNAL
    judges = [s for s in child_specs(config) if s.name.startswith("judge")]
    assert [s.name for s in judges] == ["judge-0"]
    [judge] = judges
    assert judge.module == "tidal.inference" and judge.args == judge.restart_args
    names = [s.name for s in child_specs(config)]
    assert names.index("judge-0") < names.index("orchestrator")


def test_the_judge_child_serves_its_folder_over_http_on_the_urls_port(tmp_path: Path) -> None:
    config = run_config(tmp_path)
    run_dir = prepare_run_dir(config)
    [judge] = [s for s in child_specs(config) if s.name == "judge-0"]
    argv = ["@", str(run_dir / "config.toml"), *judge.args]
    child = load_config(InferenceRunConfig, argv, environ={})[0]
    served = config.orchestrator.task_list[0].reward
    assert served is not None and served.type == "judge"
    assert child.inference.model_path == tmp_path / "judge"
    http = child.inference.http
    assert (http.enabled, http.tls, http.served_model_name) == (True, False, "grader")
    assert http.url() == served.base_url
    assert child.endpoints.inference not in {config.endpoints.inference}


def test_a_keyed_openai_endpoint_and_a_served_judge_are_refused_together(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("secret")
    config = run_config(tmp_path, "--inference.http.api-key-file", str(key))
    with pytest.raises(ConfigError, match="api_key_file"):
        prepare_run_dir(config)


def test_a_judge_folder_without_config_is_refused_before_anything_starts(tmp_path: Path) -> None:
    config = run_config(tmp_path)
    (tmp_path / "judge" / "config.json").unlink()
    with pytest.raises(ConfigError, match="not a model folder"):
        prepare_run_dir(config)
