"""FSDP CPU offload has one switch, `trainer.model.fsdp_cpu_offload`: the old
`trainer.parallel.cpu_offload` is an unknown key whose error names its replacement, and
the trainer refuses the switch when it applies no FSDP (world size 1)."""

from __future__ import annotations

import pytest
import torch

from tidal.cli.config import RunConfig
from tidal.common.config.loading import ConfigError, load_config
from tidal.trainer.config import TrainerConfig
from tidal.trainer.train_step import Trainer


def test_removed_parallel_cpu_offload_names_the_model_switch() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, ["--trainer.parallel.cpu-offload", "true"], environ={})
    message = str(err.value)
    assert "unknown key 'trainer.parallel.cpu_offload'" in message
    assert "replaced by 'trainer.model.fsdp_cpu_offload'" in message


def test_fsdp_cpu_offload_is_read_from_the_model_section() -> None:
    config, _ = load_config(RunConfig, ["--trainer.model.fsdp-cpu-offload", "true"], environ={})
    assert config.trainer.model.fsdp_cpu_offload
    assert "cpu_offload" not in type(config.trainer.parallel).model_fields


def test_the_trainer_refuses_it_without_fsdp() -> None:
    """At world size 1 the trainer applies no FSDP, so the lever would silently do nothing."""
    config = TrainerConfig.model_validate({"model": {"fsdp_cpu_offload": True}})
    with pytest.raises(ConfigError, match=r"fsdp_cpu_offload needs FSDP.*world_size > 1"):
        Trainer(config, seed=0, device=torch.device("cpu"))
