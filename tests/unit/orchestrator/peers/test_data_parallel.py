"""The orchestrator packs for the trainer's data-parallel degree; a config that restates
it differently fails at start naming both settings and the fix."""

from __future__ import annotations

import pytest

from tidal.common.errors import ConfigError
from tidal.orchestrator.peers.data_parallel import resolve_data_parallel_ranks

TRAINER = "127.0.0.1:50052"


def test_unset_uses_the_trainers_degree() -> None:
    assert resolve_data_parallel_ranks(None, 4, trainer=TRAINER) == 4


def test_a_setting_equal_to_the_trainers_is_accepted() -> None:
    assert resolve_data_parallel_ranks(2, 2, trainer=TRAINER) == 2


def test_a_different_setting_names_both_settings_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_data_parallel_ranks(2, 1, trainer=TRAINER)
    message = str(err.value)
    assert "orchestrator.packing.data_parallel_ranks = 2" in message
    assert f"trainer at {TRAINER} trains with 1 data-parallel rank" in message
    assert "trainer.world_size" in message and "trainer.parallel." in message
    assert "unset orchestrator.packing.data_parallel_ranks" in message
    assert "or set it to 1" in message


def test_a_trainer_that_does_not_report_it_falls_back_to_the_setting_or_one() -> None:
    assert resolve_data_parallel_ranks(3, 0, trainer=TRAINER) == 3
    assert resolve_data_parallel_ranks(None, 0, trainer=TRAINER) == 1
