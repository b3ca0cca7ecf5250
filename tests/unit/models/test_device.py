"""`<service>.device` made concrete (here the trainer's): a GPU per local rank for CUDA,
else the CPU or an error.

Found on a one-GPU machine: `tidal rl --trainer.world-size 2` with the default "auto"
sent rank 1 to `cuda:1`, which died with "invalid device ordinal".
"""

from __future__ import annotations

import logging

import pytest

from tidal.common.errors import ConfigError
from tidal.models.device import pick_device


def test_auto_takes_cuda_when_every_local_rank_has_a_gpu() -> None:
    assert pick_device("auto", service="trainer", gpus=2, local_ranks=2) == "cuda"
    assert pick_device("auto", service="trainer", gpus=8, local_ranks=1) == "cuda"


def test_auto_without_gpus_is_the_cpu() -> None:
    assert pick_device("auto", service="trainer", gpus=0, local_ranks=4) == "cpu"


def test_auto_with_fewer_gpus_than_local_ranks_runs_on_the_cpu_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert pick_device("auto", service="trainer", gpus=1, local_ranks=2) == "cpu"
    assert "2 trainer ranks on this host but 1 GPU(s)" in caplog.text


def test_explicit_cuda_with_too_few_gpus_is_a_config_error_naming_the_keys() -> None:
    with pytest.raises(ConfigError, match=r"trainer.device.*1 GPU.*2 trainer rank.*world_size"):
        pick_device("cuda", service="trainer", gpus=1, local_ranks=2)
    with pytest.raises(ConfigError, match="0 GPU"):
        pick_device("cuda", service="trainer", gpus=0, local_ranks=1)


def test_explicit_cpu_stays_on_the_cpu_beside_gpus() -> None:
    assert pick_device("cpu", service="trainer", gpus=8, local_ranks=1) == "cpu"
