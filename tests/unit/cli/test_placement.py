"""`[deployment]`: inference first, then the trainer, on the visible GPUs; CPU refuses GPUs."""

from __future__ import annotations

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import apply_placement
from tidal.cli.placement import DeploymentConfig, place, visible_gpus
from tidal.common.errors import ConfigError


def test_inference_takes_the_first_gpus_and_the_trainer_the_next() -> None:
    devices = place(DeploymentConfig(num_infer_gpus=2, num_train_gpus=3), list("01234567"))
    assert devices == {"inference": "0,1", "trainer": "2,3,4"}


def test_visible_devices_are_honoured_in_order() -> None:
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "4,6,7"})
    assert place(DeploymentConfig(num_infer_gpus=1, num_train_gpus=2), gpus) == {
        "inference": "4",
        "trainer": "6,7",
    }


def test_asking_for_gpus_on_a_cpu_machine_names_the_fields() -> None:
    with pytest.raises(ConfigError, match=r"num_infer_gpus \+ deployment.num_train_gpus = 0 \+ 2"):
        place(DeploymentConfig(num_train_gpus=2), [])


def test_trainer_gpus_become_its_world_size_and_device() -> None:
    config = RunConfig.model_validate({"deployment": {"num_infer_gpus": 1, "num_train_gpus": 2}})
    envs = apply_placement(config, ["0", "1", "2"])
    assert config.trainer.world_size == 2 and config.trainer.device == "cuda"
    assert config.inference.device == "cuda"
    assert envs == {
        "inference": {"CUDA_VISIBLE_DEVICES": "0"},
        "trainer": {"CUDA_VISIBLE_DEVICES": "1,2"},
    }


def test_cpu_default_changes_nothing() -> None:
    config = RunConfig()
    assert apply_placement(config, []) == {}
    assert config.trainer.world_size == 1 and config.trainer.device == "auto"
