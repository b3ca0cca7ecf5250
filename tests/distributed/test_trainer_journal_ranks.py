"""A 2-rank torchrun trainer journals its steps: SIGKILLed mid-run it resumes bitwise.

Weightsync and `python -m tidal.trainer` with `trainer.world_size = 2` (gloo, torchrun)
as real processes, `trainer.ckpt.interval` unset. Three steps (each with a micro-batch
for each data-parallel rank) write no checkpoint, only journal entries; then the whole
job is SIGKILLed. The trainer restarted with `--resume` rebuilds its initial weights and
replays the three steps through its leader on both ranks, answers step 3's retry as a
duplicate, and on SIGTERM checkpoints its last step: that checkpoint, loaded into one
process, holds bitwise the weights published as version 3 before the kill.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w
import torch

from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc
from tidal.trainer.config import TrainerConfig
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.trainer.train_step import Trainer
from tidal.weights.folder import load_version, version_dir
from tidal.weights.manifest import WeightManifest

from ..helpers.micro_batches import wire_micro_batch
from ..integration.test_trainer_kill_resume import TINY_MODEL, Stack

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
STEPS = 3


class RanksStack(Stack):
    """The kill-resume stack with a 2-rank trainer and the checkpoint interval unset."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        config = tomllib.loads(self.config.read_text())
        config["trainer"]["world_size"] = 2
        del config["trainer"]["ckpt"]
        self.config.write_text(tomli_w.dumps(config))

    def train_ranks(self, step: int) -> pb.TrainResponse:
        request = pb.TrainRequest(
            step=step,
            micro_batches=[
                wire_micro_batch([6, 9], seed=step, rank=0),
                wire_micro_batch([5, 4, 7], seed=100 + step, rank=1),
            ],
            loss=pb.LOSS_KIND_POLICY_GRADIENT,
        )
        with self.channel("orchestrator") as channel:
            return pb_grpc.TrainerServiceStub(channel).Train(request, timeout=120)


@pytest.fixture
def stack(tmp_path: Path):  # type: ignore[no-untyped-def]
    stack = RanksStack(tmp_path)
    yield stack
    for process in stack.processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for pid in job_pids(stack.config):  # a failed test must not leave ranks running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def job_pids(config: Path) -> list[int]:
    """torchrun and its ranks (each rank runs in a session of its own)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if str(config).encode() in argv and b"tidal.trainer" in argv:
            pids.append(int(proc.name))
    return pids


def kill_job(stack: Stack, process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole job at once, as a crashed machine or an OOM kill of it would."""
    for pid in job_pids(stack.config):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=60)
    deadline = time.monotonic() + 60
    while job_pids(stack.config):  # the ranks are gone, and with them the served port
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_killed_two_rank_trainer_replays_its_journal_bitwise(stack: RanksStack) -> None:
    ckpt_dir = stack.run_dir / "checkpoints"
    stack.start("weightsync")
    trainer = stack.start("trainer")
    assert stack.trainer_status(trainer).data_parallel_ranks == 2
    for step in range(1, STEPS + 1):
        assert stack.train_ranks(step).policy_version == step
    # Durable by the journal alone: no checkpoint after every step.
    assert not list(ckpt_dir.glob("step_*")), sorted(p.name for p in ckpt_dir.iterdir())
    journaled = sorted(p.name for p in (ckpt_dir / "journal").glob("step_*"))
    assert journaled == [f"step_{s:08d}" for s in range(1, STEPS + 1)]
    kill_job(stack, trainer)

    resumed = stack.start("trainer", "--resume")
    status = stack.trainer_status(resumed)
    assert (status.step, status.policy_version) == (STEPS, STEPS)
    log = stack.log("trainer")
    for step in range(1, STEPS + 1):
        assert f"replayed step {step} from the step journal" in log
    again = stack.train_ranks(STEPS)
    assert (again.step, again.duplicate) == (STEPS, True)
    os.killpg(resumed.pid, signal.SIGTERM)  # torchrun forwards it to the ranks (and
    resumed.wait(timeout=120)  # exits 1 itself: its SignalException)

    # The replayed state, checkpointed on stop, is what was published before the kill.
    single = Trainer(TrainerConfig.model_validate({"model": TINY_MODEL}), seed=0,
                     device=torch.device("cpu"))  # fmt: skip
    checkpoints = CheckpointManager(ckpt_dir, keep_last=2)
    assert [s for s, _ in checkpoints.complete()] == [STEPS], stack.log("trainer")[-3000:]
    checkpoints.load(single)
    assert single.trained_step == STEPS
    _, published = load_version(WeightManifest.read(version_dir(stack.run_dir / "weights", STEPS)))
    replayed = single.state_dict_for_publish()
    assert replayed.keys() == published.keys()
    for name, tensor in published.items():
        assert torch.equal(replayed[name], tensor), name
