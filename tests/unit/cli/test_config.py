"""The whole run config composes over configs/default.toml, task type switches included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.common.config.loading import load_config
from tidal.common.errors import ConfigError
from tidal.orchestrator.task_config import ArithmeticTaskConfig, CountdownTaskConfig
from tidal.trainer.config import TrainerRunConfig
from tidal.weightsync.config import StreamTransport

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]


def test_docs_countdown_example_composes_over_the_default_run(tmp_path: Path) -> None:
    countdown = tmp_path / "countdown.toml"
    countdown.write_text('[orchestrator.task]\ntype = "countdown"\nnum_numbers = 4\n')
    config, _ = load_config(RunConfig, [*DEFAULT, "@", str(countdown)], environ={})
    assert config.orchestrator.task == CountdownTaskConfig(num_numbers=4)


def test_task_type_flag_switches_the_default_task() -> None:
    argv = [*DEFAULT, "--orchestrator.task.type", "arithmetic"]
    config, _ = load_config(RunConfig, argv, environ={})
    assert config.orchestrator.task == ArithmeticTaskConfig()


def test_weight_transport_type_flag_replaces_the_transport_section(tmp_path: Path) -> None:
    broadcast = tmp_path / "broadcast.toml"
    broadcast.write_text('[weightsync.transport]\ntype = "broadcast"\nreplicas = 2\n')
    argv = [*DEFAULT, "@", str(broadcast), "--weightsync.transport.type", "stream"]
    config, _ = load_config(RunConfig, argv, environ={})
    assert config.weightsync.transport == StreamTransport()


def test_the_rl_run_carries_the_sft_and_export_sections_and_a_service_every_other() -> None:
    argv = [*DEFAULT, "--sft.steps", "3", "--export.version", "2"]
    config, _ = load_config(RunConfig, argv, environ={})
    assert config.sft == {"steps": 3} and config.export == {"version": 2}
    launcher = ["--deployment.num-train-gpus", "1", "--supervision.max-restarts", "0"]
    trainer, _ = load_config(TrainerRunConfig, [*argv, *launcher], environ={})
    assert trainer.sft == {"steps": 3} and trainer.supervision == {"max_restarts": 0}


def test_shared_prompts_with_a_setting_that_refuses_them_fail_at_start() -> None:
    argv = [*DEFAULT, "--orchestrator.packing.share-prompts", "true"]
    config, _ = load_config(RunConfig, argv, environ={})
    assert config.orchestrator.packing.share_prompts
    truncated = [*argv, "--trainer.model.truncation.max-prompt-tokens", "8"]
    with pytest.raises(ConfigError, match=r"truncation\.max_prompt_tokens = 8"):
        load_config(RunConfig, truncated, environ={})


def test_shared_prompts_left_unset_follow_the_trainer() -> None:
    config, _ = load_config(RunConfig, DEFAULT, environ={})
    assert config.orchestrator.packing.share_prompts  # on by default
    truncated = [*DEFAULT, "--trainer.model.truncation.max-prompt-tokens", "8"]
    config, _ = load_config(RunConfig, truncated, environ={})
    assert not config.orchestrator.packing.share_prompts  # off for a trainer that truncates
    off = [*DEFAULT, "--orchestrator.packing.share-prompts", "false"]
    assert not load_config(RunConfig, off, environ={})[0].orchestrator.packing.share_prompts
