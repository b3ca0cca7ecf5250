"""Fixtures shared by the trainer's unit tests.

`step_batches(step)` is a deterministic RL step's data (three random samples with
behaviour logprobs and advantages, packed for a tiny model): the tests that compare two
trainers step by step (checkpoint resume, optimizer offload) feed both the same batches.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData
from tidal.trainer.sft import pack_for_trainer

StepBatches = Callable[[int], list[MicroBatchData]]


def batches_for(step: int) -> list[MicroBatchData]:
    g = random.Random(step)
    samples = [
        TrainSample(
            (256, *(g.randrange(256) for _ in range(3))),
            tuple(g.randrange(256) for _ in range(5)),
            advantage=g.uniform(-1, 1),
            completion_logprobs=tuple(-g.uniform(0.5, 3) for _ in range(5)),
        )
        for _ in range(3)
    ]
    return pack_for_trainer(samples, 64)


@pytest.fixture
def step_batches() -> StepBatches:
    return batches_for
