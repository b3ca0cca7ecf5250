"""The judge replicas `tidal rl` starts: one inference child per folder a judge reward names.

A judge with `model_path` is served by an inference process of its own: the run's
`[inference]` settings and GPUs, that folder as a fixed version 0 (`inference.model_path`,
never following weight-sync), and the OpenAI endpoint on a free loopback port without
TLS. `assign_judge_urls` writes that endpoint into every judge naming the folder before
the resolved config is written, so the orchestrator reads where its judge is; tasks
naming one folder share its replica.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tidal.cli.config import RunConfig
from tidal.cli.inference_replicas import Replica
from tidal.cli.ports import free_address, free_port
from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.model_reward_config import JudgeRewardConfig


def served_judges(config: RunConfig) -> list[JudgeRewardConfig]:
    """The judge rewards of the run's tasks that name a folder for `tidal rl` to serve."""
    rewards = [task.reward for task in config.orchestrator.task_list]
    return [r for r in rewards if isinstance(r, JudgeRewardConfig) and r.model_path is not None]


def assign_judge_urls(config: RunConfig) -> dict[Path, str]:
    """Give each judge folder a free loopback HTTP port; point its judges at it (their
    `base_url`, and `model`, the first such judge's). Returns folder → base URL."""
    judges = served_judges(config)
    if judges and config.inference.http.api_key_file is not None:
        raise ConfigError(
            "a judge replica serves on loopback without an API key, but inference.http."
            "api_key_file applies to every inference process: unset it, or serve the judge "
            "yourself and set the judge's base_url (with api_key_env)"
        )
    urls: dict[Path, str] = {}
    names: dict[Path, str] = {}
    for judge in judges:
        assert judge.model_path is not None
        folder = judge.model_path.resolve()
        if not (folder / "config.json").is_file():
            raise ConfigError(f"judge model_path {folder} is not a model folder (no config.json)")
        if folder not in urls:
            urls[folder] = f"http://127.0.0.1:{free_port()}/v1"
            names[folder] = judge.model
        judge.model_path, judge.base_url, judge.model = folder, urls[folder], names[folder]
    return urls


def judge_replicas(config: RunConfig, env: dict[str, str]) -> list[Replica]:
    """The inference children serving the run's judges (after `assign_judge_urls`)."""
    served: dict[Path, tuple[str, str]] = {}
    for judge in served_judges(config):
        assert judge.model_path is not None and judge.base_url is not None
        served.setdefault(judge.model_path, (judge.base_url, judge.model))
    replicas = []
    for i, (folder, (url, model)) in enumerate(served.items()):
        name = f"judge-{i}"
        args = (
            *("--endpoints.inference", free_address()),
            *("--inference.replica_id", name),
            *("--inference.model_path", str(folder)),
            *("--inference.http.enabled", "true"),
            *("--inference.http.host", "127.0.0.1"),
            *("--inference.http.port", str(urlsplit(url).port)),
            *("--inference.http.tls", "false"),
            *("--inference.http.served_model_name", model),
        )
        replicas.append(Replica(name, args, dict(env)))
    return replicas
