"""A trainer SIGKILLed the moment its step's version appears in weightsync resumes.

Weightsync and the trainer run as real processes (`python -m tidal.<service>`), the
trainer with `trainer.ckpt.interval = 1`. The test sends Train(2) and kills the trainer
as soon as version 2 is on disk, before Train(2) can answer: with the checkpoint written
before the publish, step 2 is durable by then, so `--resume` continues at step 3 instead
of refusing "version 2, newer than the checkpoint of step 1". Step 2's retry is then
answered as a duplicate (the checkpoint holds its payload fingerprint), and step 2 with
other data is refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tomli_w
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.cli.ports import free_port
from tidal.common.security.credentials import ensure_certificates
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc
from tidal.weights.folder import version_dir
from tidal.weights.manifest import MANIFEST_FILE

from ..helpers.micro_batches import wire_micro_batch
from ..tls_fixtures import role_channel

SERVING = health_pb2.HealthCheckResponse.SERVING
TINY_MODEL = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64}


def train_request(step: int) -> pb.TrainRequest:
    return pb.TrainRequest(
        step=step,
        micro_batches=[wire_micro_batch([6, 9], seed=step)],
        loss=pb.LOSS_KIND_POLICY_GRADIENT,
    )


class Stack:
    def __init__(self, tmp_path: Path) -> None:
        self.run_dir = tmp_path / "outputs" / "killed"
        self.trainer_address = f"127.0.0.1:{free_port()}"
        config = {
            "run": {"output_dir": str(tmp_path / "outputs"), "name": "killed"},
            "endpoints": {
                "trainer": self.trainer_address,
                "weightsync": f"127.0.0.1:{free_port()}",
            },
            "grpc": {"shutdown_grace_s": 0.5},
            "trainer": {"device": "cpu", "model": TINY_MODEL, "ckpt": {"interval": 1}},
        }
        (self.run_dir / "logs").mkdir(parents=True)
        ensure_certificates(self.run_dir / "tls")  # as `tidal rl` does: mTLS by default
        self.config = self.run_dir / "config.toml"
        self.config.write_text(tomli_w.dumps(config))
        self.processes: list[subprocess.Popen[bytes]] = []

    def channel(self, role: str) -> grpc.Channel:
        return role_channel(self.run_dir / "tls", role, self.trainer_address)

    def start(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        log = (self.run_dir / "logs" / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", f"tidal.{name}", "@", str(self.config), *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.run_dir / "logs" / f"{name}.log").read_text()

    def trainer_status(self, trainer: subprocess.Popen[bytes]) -> pb.TrainerStatus:
        """Wait until the trainer's health is SERVING (after its startup publish), then
        return its status. A trainer that exits meanwhile fails the test with its log."""
        deadline = time.monotonic() + 120
        check = health_pb2.HealthCheckRequest(service="tidal.rpc.v1.TrainerService")
        with self.channel("orchestrator") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                assert trainer.poll() is None, self.log("trainer")
                assert time.monotonic() < deadline, self.log("trainer")
                try:
                    if health.Check(check, timeout=5).status == SERVING:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
            stub = pb_grpc.TrainerServiceStub(channel)
            return stub.GetStatus(common_pb2.StatusRequest(), timeout=10)

    def train(self, step: int) -> pb.TrainResponse:
        with self.channel("orchestrator") as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            return stub.Train(train_request(step), timeout=120)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path)
    yield stack
    for process in stack.processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    "durability",
    [(), ("--trainer.ckpt.interval", "20")],
    ids=["checkpoint-every-step", "journal-no-checkpoint-yet"],
)
def test_trainer_killed_right_after_publishing_resumes_without_refusal(
    stack: Stack, durability: tuple[str, ...]
) -> None:
    """With a checkpoint every step, step 2 is in its checkpoint when version 2 appears;
    with the default interval (20) there is no checkpoint at all yet, and the resumed
    trainer rebuilds the initial model and replays steps 1 and 2 from its step journal."""
    stack.start("weightsync")
    trainer = stack.start("trainer", *durability)
    stack.trainer_status(trainer)
    assert stack.train(1).policy_version == 1

    published = version_dir(stack.run_dir / "weights", 2) / MANIFEST_FILE
    with stack.channel("orchestrator") as channel:
        pending = pb_grpc.TrainerServiceStub(channel).Train.future(train_request(2), timeout=120)
        deadline = time.monotonic() + 120
        while not published.is_file():  # version 2 is on disk: kill before Train answers
            assert time.monotonic() < deadline and trainer.poll() is None, stack.log("trainer")
            time.sleep(0.005)
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        pending.cancel()  # it may have answered just before the kill; either way is the case

    resumed = stack.start("trainer", "--resume", *durability)
    status = stack.trainer_status(resumed)
    assert (status.step, status.policy_version) == (2, 2)
    assert "newer than the checkpoint" not in stack.log("trainer")
    if durability:
        assert "replayed step 2 from the step journal" in stack.log("trainer")
    # The orchestrator's retry of step 2 (its reply died with the old process) is answered
    # as a duplicate: the checkpoint or journal kept step 2's fingerprint. Other data under
    # id 2 is not.
    again = stack.train(2)
    assert (again.step, again.policy_version, again.duplicate) == (2, 2, True)
    other = train_request(2)
    other.micro_batches[0].CopyFrom(wire_micro_batch([6, 9], seed=99))
    with stack.channel("orchestrator") as channel, pytest.raises(grpc.RpcError) as e:
        pb_grpc.TrainerServiceStub(channel).Train(other, timeout=120)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already trained with other data" in str(e.value.details())
    third = stack.train(3)
    assert (third.step, third.policy_version, third.duplicate) == (3, 3, False)


def long_request(step: int, micro_batches: int) -> pb.TrainRequest:
    return pb.TrainRequest(
        step=step,
        micro_batches=[
            wire_micro_batch([6, 9], seed=step * 10_000 + i) for i in range(micro_batches)
        ],
        loss=pb.LOSS_KIND_POLICY_GRADIENT,
    )


@pytest.mark.slow
def test_sigterm_abandons_a_long_step_at_a_micro_batch_and_the_trainer_exits(
    stack: Stack,
) -> None:
    """SIGTERM during a long Train stops the step at its next micro-batch boundary: Train
    answers UNAVAILABLE, nothing is committed or published, the process exits 0 promptly,
    and the step trains on the resumed trainer."""
    stack.start("weightsync")
    trainer = stack.start("trainer")
    stack.trainer_status(trainer)
    assert stack.train(1).policy_version == 1
    with stack.channel("orchestrator") as channel:
        pending = pb_grpc.TrainerServiceStub(channel).Train.future(
            long_request(2, 3000), timeout=120
        )
        time.sleep(3.0)  # the step is under way (3,000 micro-batches take far longer)
        assert not pending.done(), "the step ended before SIGTERM; make it longer"
        signalled = time.monotonic()
        os.killpg(trainer.pid, signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as err:
            pending.result(timeout=60)
        # UNAVAILABLE either way: "abandoned" from the step, or the server's own
        # "Cancelling all calls" when the shutdown grace (0.5 s here) ran out first.
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert trainer.wait(30) == 0
    assert "step was abandoned at a micro-batch boundary" in stack.log("trainer")
    assert time.monotonic() - signalled < 15, stack.log("trainer")
    assert not version_dir(stack.run_dir / "weights", 2).exists()

    resumed = stack.start("trainer", "--resume")
    status = stack.trainer_status(resumed)
    assert (status.step, status.policy_version) == (1, 1)  # step 2 was never committed
    second = stack.train(2)
    assert (second.step, second.policy_version, second.duplicate) == (2, 2, False)


@pytest.mark.slow
def test_a_trainer_started_before_weightsync_waits_for_it(stack: Stack) -> None:
    """A trainer started before weightsync logs that it waits for weightsync at its address
    and starts once it is up; with no weightsync at all it stops after
    `trainer.weightsync_timeout_s` naming it."""
    trainer = stack.start("trainer")
    address = stack.config.read_text().split('weightsync = "')[1].split('"')[0]
    deadline = time.monotonic() + 90
    while f"waiting for weightsync at {address}" not in stack.log("trainer"):
        assert trainer.poll() is None and time.monotonic() < deadline, stack.log("trainer")
        time.sleep(0.2)
    stack.start("weightsync")
    status = stack.trainer_status(trainer)
    assert status.policy_version == 0
    assert stack.train(1).policy_version == 1
    os.killpg(trainer.pid, signal.SIGKILL)
    trainer.wait()

    for process in stack.processes:  # now no weightsync at all: a bounded wait
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    alone = stack.start("trainer", "--resume", "--trainer.weightsync-timeout-s", "3")
    assert alone.wait(90) == 1
    log = stack.log("trainer")
    assert f"weightsync at {address} did not answer" in log
    assert "trainer.weightsync_timeout_s" in log and "Traceback" not in log


@pytest.mark.slow
def test_a_step_whose_publish_finds_weightsync_restarting_succeeds(stack: Stack) -> None:
    """Weightsync SIGKILLed between two steps and restarted while the trainer
    publishes the next one: the trainer waits for it, publishes, and Train(2) answers
    normally (version 1, recovered from disk, is still there). The serial contract (Train
    answers after its publish); the background one: the next test."""
    weightsync = stack.start("weightsync")
    trainer = stack.start("trainer", "--trainer.background-publish", "false")
    stack.trainer_status(trainer)
    assert stack.train(1).policy_version == 1
    os.killpg(weightsync.pid, signal.SIGKILL)
    weightsync.wait()
    with stack.channel("orchestrator") as channel:
        pending = pb_grpc.TrainerServiceStub(channel).Train.future(train_request(2), timeout=120)
        time.sleep(3.0)  # step 2 is trained and checkpointed; its publish waits
        assert not pending.done(), "Train(2) answered while weightsync was down"
        stack.start("weightsync")
        reply = pending.result(timeout=120)
    assert (reply.step, reply.policy_version, reply.duplicate) == (2, 2, False)
    assert trainer.poll() is None
    assert "recovered verified versions [0, 1]" in stack.log("weightsync")
    third = stack.train(3)
    assert (third.step, third.policy_version, third.duplicate) == (3, 3, False)


def published_version(stack: Stack) -> int:
    with stack.channel("orchestrator") as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        return stub.GetStatus(common_pb2.StatusRequest(), timeout=10).policy_version


@pytest.mark.slow
def test_background_publish_rides_out_a_weightsync_restart_in_step_order(stack: Stack) -> None:
    """The same outage under the default `trainer.background_publish`: Train(2) answers
    once step 2 is trained although weightsync is down; step 3's update then waits for
    version 2 (versions stay in step order), and both follow once weightsync is back."""
    weightsync = stack.start("weightsync")
    trainer = stack.start("trainer")
    stack.trainer_status(trainer)
    assert stack.train(1).policy_version == 1
    deadline = time.monotonic() + 60
    while published_version(stack) < 1:  # step 1 ends with its publish, in the background
        assert time.monotonic() < deadline, stack.log("trainer")
        time.sleep(0.05)
    os.killpg(weightsync.pid, signal.SIGKILL)
    weightsync.wait()
    second = stack.train(2)  # trained: answered; its checkpoint and publish go on
    assert (second.step, second.policy_version, second.duplicate) == (2, 2, False)
    assert published_version(stack) == 1
    with stack.channel("orchestrator") as channel:
        pending = pb_grpc.TrainerServiceStub(channel).Train.future(train_request(3), timeout=120)
        time.sleep(3.0)  # step 3's forward/backward ran; its update waits for version 2
        assert not pending.done(), "Train(3) answered before version 2 was published"
        assert (stack.run_dir / "checkpoints" / "step_00000002").is_dir()  # durable first
        stack.start("weightsync")
        reply = pending.result(timeout=120)
    assert (reply.step, reply.policy_version, reply.duplicate) == (3, 3, False)
    assert trainer.poll() is None
    assert "recovered verified versions [0, 1]" in stack.log("weightsync")
    deadline = time.monotonic() + 60
    while published_version(stack) < 3:
        assert time.monotonic() < deadline, stack.log("trainer")
        time.sleep(0.05)
