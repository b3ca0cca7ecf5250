"""A `type = "verifiers"` task's start-up errors: each names what to install or set."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tidal.common.errors import ConfigError
from tidal.orchestrator.rollouts.verifiers_env import VerifiersTask, connect_tasks
from tidal.orchestrator.task_config import VerifiersTaskConfig
from tidal.orchestrator.tasks.registry import build_task

HELPERS = Path(__file__).resolve().parents[3] / "helpers"


def test_without_the_library_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers", None)  # an import of it fails
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ConfigError, match=r"tidal-orchestrator\[verifiers\]"):
        build_task(VerifiersTaskConfig(env="vf_vowels"), seed=0)


def test_an_unknown_environment_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="no_such_env"):
        build_task(VerifiersTaskConfig(env="no_such_env"), seed=0)


def test_without_the_http_server_or_a_model_folder_the_error_names_the_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(HELPERS))
    task = build_task(VerifiersTaskConfig(env="vf_vowels", args={"size": 2}), seed=0)
    assert isinstance(task, VerifiersTask) and task.size() == 2
    cases = [
        ({}, tmp_path, "inference.http.enabled"),
        ({"http": {"enabled": True, "port": 8000, "tls": True}}, tmp_path, "inference.http.tls"),
        ({"http": {"enabled": True}}, tmp_path, "inference.http.port"),
        ({"http": {"enabled": True, "port": 8000}}, None, "trainer.model.path"),
    ]
    for inference, model, key in cases:
        with pytest.raises(ConfigError, match=key):
            connect_tasks([task], inference=inference, model=model)
