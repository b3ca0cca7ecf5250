"""TrainerService over a real in-process gRPC server, publishing to a real weightsync."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tidal.batch.packing import TrainSample, build_micro_batch
from tidal.batch.tensor_codec import encode_array
from tidal.batch.wire import micro_batch_from_proto, micro_batch_to_proto, payload_sha256
from tidal.common.errors import DiskFull, FailedPrecondition
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.interceptors import ERROR_KIND_KEY
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.models.hf_checkpoint import hf_to_native_state_dict
from tidal.orchestrator.config import RecoveryConfig
from tidal.orchestrator.peers.peer_client import PeerError
from tidal.orchestrator.peers.train_delivery import TrainDelivery
from tidal.orchestrator.peers.trainer_client import TrainerClient
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc
from tidal.trainer.config import TrainerRunConfig
from tidal.trainer.main import RunningTrainer, start_trainer
from tidal.trainer.persistence import state_file
from tidal.trainer.persistence.checkpoint import CheckpointManager
from tidal.weights.folder import load_version

from ..helpers.micro_batches import wire_micro_batch
from ..helpers.small_disk import small_disk
from ..helpers.waiting import until

if TYPE_CHECKING:
    from conftest import RunningWeightSync  # the shared fixture's type (tests/conftest.py)

TINY_MODEL = {
    "dim": 32,
    "n_layers": 1,
    "n_heads": 2,
    "n_kv_heads": 1,
    "ffn_dim": 64,
    "max_seq_len": 32,
}
PG, SFT = pb.LOSS_KIND_POLICY_GRADIENT, pb.LOSS_KIND_SFT


def run_config(
    tmp_path: Path, weightsync: RunningWeightSync, *, background: bool = False
) -> TrainerRunConfig:
    """The serial contract (Train answers after its version is published) unless
    `background`, the default mode, which the last tests of this file pin."""
    trainer: dict[str, object] = {
        "model": TINY_MODEL,
        "device": "cpu",
        "publish_dir": str(weightsync.root),
        "background_publish": background,
    }
    if background:  # a checkpoint every step: these tests pin checkpoint-before-publish
        trainer["ckpt"] = {"keep_last": 10, "interval": 1}
    return TrainerRunConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path), "name": "bg" if background else "contract"},
            "endpoints": {"trainer": "127.0.0.1:0", "weightsync": weightsync.address},
            "grpc": {"shutdown_grace_s": 0.5},
            "security": {"mode": "plaintext"},  # in-process, loopback only
            "trainer": trainer,
        }
    )


@pytest.fixture
async def trainer(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> AsyncIterator[RunningTrainer]:
    running = await start_trainer(run_config(tmp_path, weightsync_server))
    yield running
    await running.stop()


@pytest.fixture
async def stub(trainer: RunningTrainer) -> AsyncIterator[pb_grpc.TrainerServiceStub]:
    async with make_channel(
        f"127.0.0.1:{trainer.server.port}", security=PLAINTEXT_LOOPBACK
    ) as channel:
        yield pb_grpc.TrainerServiceStub(channel)


def request(step: int, *batches: pb.MicroBatch, loss: int = PG) -> pb.TrainRequest:
    return pb.TrainRequest(
        step=step, micro_batches=batches or [wire_micro_batch([6, 9])], loss=loss
    )


async def status(stub: pb_grpc.TrainerServiceStub) -> pb.TrainerStatus:
    return await stub.GetStatus(common_pb2.StatusRequest())


async def test_startup_publishes_version_0_and_serves(
    trainer: RunningTrainer, weightsync_server: RunningWeightSync, stub: pb_grpc.TrainerServiceStub
) -> None:
    assert weightsync_server.registry.newest == 0
    async with make_channel(
        f"127.0.0.1:{trainer.server.port}", security=PLAINTEXT_LOOPBACK
    ) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    s = await status(stub)
    assert (s.step, s.policy_version, s.steps_trained, s.device) == (0, 0, 0, "cpu")
    assert s.num_parameters > 0 and s.model.startswith("llama")
    assert s.data_parallel_ranks == 1  # one process: the orchestrator packs for one rank
    tokenizer = s.tokenizer  # the run's, for the orchestrator's agreement check
    assert (tokenizer.name, tokenizer.vocab_size, list(tokenizer.eos_ids)) == ("byte", 259, [257])


async def test_train_trains_and_publishes_version_equal_to_step(
    weightsync_server: RunningWeightSync, stub: pb_grpc.TrainerServiceStub
) -> None:
    first = await stub.Train(request(1, wire_micro_batch([6, 9]), wire_micro_batch([12], seed=1)))
    assert (first.step, first.policy_version, first.duplicate) == (1, 1, False)
    assert {"loss", "grad_norm", "tokens", "entropy", "clip_frac", "mismatch_kl"} <= set(
        first.metrics
    )
    assert first.metrics["tokens"] == 27 and first.metrics["grad_norm"] > 0
    assert weightsync_server.registry.newest == 1

    second = await stub.Train(request(2, loss=SFT))
    assert second.policy_version == 2 and weightsync_server.registry.newest == 2
    # the published weights changed from version 1 to 2 and carry the HF config
    v1 = load_version(weightsync_server.registry.get(1).manifest)
    v2 = load_version(weightsync_server.registry.get(2).manifest)
    assert v2[0]["hidden_size"] == 32 and "lm_head.weight" not in v2[1]
    assert not np.array_equal(
        v1[1]["model.norm.weight"].numpy(), v2[1]["model.norm.weight"].numpy()
    )
    s = await status(stub)
    assert (s.step, s.policy_version, s.steps_trained) == (2, 2, 2)


def shared_prompt_micro_batch() -> pb.MicroBatch:
    """Three completions of one prompt after a single copy of it (sample_parents)."""
    prompt = (256, 10, 20, 30, 40)
    samples = [
        TrainSample(prompt, completion, advantage=a, completion_logprobs=(-5.6,) * 3)
        for completion, a in (((1, 2, 3), 1.0), ((4, 5, 6), -0.5), ((7, 8, 9), 0.25))
    ]
    return micro_batch_to_proto(build_micro_batch(samples, share_prompts=True))


async def test_a_shared_prompt_micro_batch_trains_and_a_bad_parent_is_refused(
    weightsync_server: RunningWeightSync, stub: pb_grpc.TrainerServiceStub
) -> None:
    bad = shared_prompt_micro_batch()
    bad.sample_parents.CopyFrom(encode_array(np.array([-1, 0, 2, 0], dtype=np.int32)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Train(request(1, bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("micro_batches[0].sample_parents")
    reply = await stub.Train(request(1, shared_prompt_micro_batch()))
    assert reply.policy_version == 1 and weightsync_server.registry.newest == 1
    # the prompt once (5) and three completions (3 each), all 9 completion tokens trained
    assert (reply.metrics["tokens"], reply.metrics["loss_tokens"]) == (14, 9)


async def test_duplicate_step_is_answered_not_trained_again(
    weightsync_server: RunningWeightSync, stub: pb_grpc.TrainerServiceStub
) -> None:
    first = await stub.Train(request(1))
    again = await stub.Train(request(1))
    assert again.duplicate and (again.step, again.policy_version) == (1, 1)
    assert dict(again.metrics) == dict(first.metrics)
    s = await status(stub)
    assert (s.steps_trained, s.duplicates_answered) == (1, 1)
    assert weightsync_server.registry.newest == 1


async def test_repeated_step_with_other_data_is_refused_naming_the_step(
    weightsync_server: RunningWeightSync, stub: pb_grpc.TrainerServiceStub
) -> None:
    await stub.Train(request(1, wire_micro_batch([6, 9])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Train(request(1, wire_micro_batch([6, 9], seed=7)))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "step 1 was already trained with other data" in err.value.details()
    s = await status(stub)
    assert (s.steps_trained, s.duplicates_answered) == (1, 0)
    assert weightsync_server.registry.newest == 1


async def test_payload_sha256_that_does_not_match_the_data_is_invalid_argument(
    stub: pb_grpc.TrainerServiceStub,
) -> None:
    sent = request(1)
    sent.payload_sha256 = payload_sha256(
        sent.loss, request(1, wire_micro_batch([12])).micro_batches
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Train(sent)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("payload_sha256:")
    assert (await status(stub)).steps_trained == 0


async def test_orchestrator_client_fails_when_its_step_was_trained_with_foreign_data(
    trainer: RunningTrainer, stub: pb_grpc.TrainerServiceStub
) -> None:
    """Another client trains step 1 first (the trainer cannot tell clients apart before
    authentication exists); the run's own Train(1) must then fail, not pass as a retry."""
    await stub.Train(request(1, wire_micro_batch([6, 9], seed=3)))
    own = micro_batch_from_proto(wire_micro_batch([6, 9]), field="own")
    client = TrainerClient(f"127.0.0.1:{trainer.server.port}", security=PLAINTEXT_LOOPBACK)
    try:
        with pytest.raises(PeerError, match="step 1 was already trained with other data"):
            await client.train(1, [own], sft=False, timeout=30)
        same = micro_batch_from_proto(wire_micro_batch([6, 9], seed=3), field="same")
        retry = await client.train(1, [same], sft=False, timeout=30)  # the same data: a retry
        assert retry.duplicate and retry.policy_version == 1
    finally:
        await client.close()


async def test_concurrent_retry_of_the_step_in_flight_trains_once(
    stub: pb_grpc.TrainerServiceStub,
) -> None:
    a, b = await asyncio.gather(stub.Train(request(1)), stub.Train(request(1)))
    assert sorted([a.duplicate, b.duplicate]) == [False, True]
    assert (await status(stub)).steps_trained == 1


async def test_out_of_order_step_is_failed_precondition(stub: pb_grpc.TrainerServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Train(request(3))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "expected step 1" in err.value.details()
    assert (await status(stub)).steps_trained == 0


@pytest.mark.parametrize(
    ("make_request", "field"),
    [
        (lambda: pb.TrainRequest(step=1, loss=PG), "micro_batches"),
        (lambda: request(0), "step"),
        (lambda: request(1, loss=pb.LOSS_KIND_UNSPECIFIED), "loss"),
        (
            lambda: request(
                1,
                wire_micro_batch([6, 9]),
                wire_micro_batch([4], input_ids=np.array([256, 1, 999, 2], dtype=np.int32)),
            ),
            "micro_batches[1].input_ids",
        ),
        (
            lambda: request(1, wire_micro_batch([6, 9], advantages=np.zeros(14, dtype=np.float32))),
            "micro_batches[0].advantages",
        ),
        (
            lambda: request(1, wire_micro_batch([6, 9], sample_lengths=np.array([6, 8], np.int32))),
            "micro_batches[0].sample_lengths",
        ),
        (
            lambda: request(1, wire_micro_batch([4], input_ids=np.array([1, 2, 3, 4], np.int64))),
            "micro_batches[0].input_ids.dtype",
        ),
        (lambda: request(1, wire_micro_batch([40])), "micro_batches[0].sample_lengths"),
        (lambda: request(1, pb.MicroBatch()), "micro_batches[0].input_ids"),
        # one process trains on data-parallel rank 0 only
        (
            lambda: request(1, wire_micro_batch([6, 9]), wire_micro_batch([4], rank=1)),
            "micro_batches[1].rank",
        ),
    ],
)
async def test_bad_requests_are_invalid_argument_naming_the_field(
    stub: pb_grpc.TrainerServiceStub, make_request: Callable[[], pb.TrainRequest], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Train(make_request())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}:")
    # still serving, nothing trained, and the next good step is still step 1
    assert (await status(stub)).steps_trained == 0
    assert (await stub.Train(request(1))).policy_version == 1


async def test_step_and_publish_spans_are_children_of_the_train_rpc(
    stub: pb_grpc.TrainerServiceStub, span_exporter: InMemorySpanExporter
) -> None:
    span_exporter.clear()
    await stub.Train(request(1))
    finished = span_exporter.get_finished_spans()
    spans = {s.name: s for s in finished if s.kind == SpanKind.INTERNAL}
    (rpc,) = [
        s
        for s in finished
        if s.name == "/tidal.rpc.v1.TrainerService/Train" and s.kind == SpanKind.SERVER
    ]
    for name in ("trainer.step", "trainer.publish"):
        parent = spans[name].parent
        assert parent is not None and parent.span_id == rpc.context.span_id


async def test_refuses_to_start_when_weightsync_already_has_versions(
    tmp_path: Path,
    weightsync_server: RunningWeightSync,
    trainer: RunningTrainer,
) -> None:
    with pytest.raises(FailedPrecondition, match="weightsync already has version 0"):
        await start_trainer(run_config(tmp_path / "second", weightsync_server))


def resumable_config(
    tmp_path: Path,
    weightsync: RunningWeightSync,
    *,
    interval: int = 2,
    journal: bool = True,
    **update: object,
) -> TrainerRunConfig:
    config = run_config(tmp_path, weightsync)
    ckpt = config.trainer.ckpt.model_copy(update={"interval": interval, "journal": journal})
    trainer = config.trainer.model_copy(update={"ckpt": ckpt})
    return config.model_copy(update={"trainer": trainer, **update})


async def train_steps(
    running: RunningTrainer, steps: range | tuple[int, ...]
) -> tuple[list[pb.TrainResponse], dict[str, torch.Tensor]]:
    """Train `steps` in order; the answers and a copy of the weights after the last."""
    async with make_channel(
        f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK
    ) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        answers = [await stub.Train(request(step)) for step in steps]
    weights = {k: v.clone() for k, v in running.runner.trainer.model.state_dict().items()}
    return answers, weights


async def test_resume_continues_after_the_checkpointed_step(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    first = await start_trainer(resumable_config(tmp_path, weightsync_server))
    try:
        _, trained = await train_steps(first, (1, 2))
    finally:
        await first.stop()
    assert CheckpointManager(tmp_path / "contract" / "checkpoints", keep_last=1).latest() == (
        tmp_path / "contract" / "checkpoints" / "step_00000002"
    )

    second = await start_trainer(resumable_config(tmp_path, weightsync_server, resume=True))
    try:
        restored = second.runner.trainer.model.state_dict()
        assert all(torch.equal(trained[k], restored[k]) for k in trained)
        async with make_channel(
            f"127.0.0.1:{second.server.port}", security=PLAINTEXT_LOOPBACK
        ) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            assert (await status(stub)).step == 2
            third = await stub.Train(request(3))
        assert third.policy_version == 3 and weightsync_server.registry.newest == 3
    finally:
        await second.stop()


async def test_without_the_journal_resume_refuses_versions_newer_than_the_checkpoint(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    first = await start_trainer(resumable_config(tmp_path, weightsync_server, journal=False))
    try:  # checkpoint at 2, version 3 exists only in weightsync
        await train_steps(first, (1, 2, 3))
    finally:
        await first.stop()
    resumed = resumable_config(tmp_path, weightsync_server, journal=False, resume=True)
    with pytest.raises(FailedPrecondition, match="version 3, newer than the checkpoint of step 2"):
        await start_trainer(resumed)


async def crash(running: RunningTrainer) -> None:
    """Stop serving without the shutdown's flush (its final checkpoint): what a killed
    trainer leaves on disk once its last answered step was journaled."""
    await running.server.stop()
    await running.client.close()


async def test_resume_replays_the_journaled_steps_after_the_checkpoint_bitwise(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    """The step journal: checkpoint at 3, steps 4 and 5 only journaled; the resumed trainer
    replays them to exactly the weights of version 5, answers a retry as a duplicate
    with the replayed metrics, refuses other data under a replayed id, trains step 6."""
    first = await start_trainer(resumable_config(tmp_path, weightsync_server, interval=3))
    try:
        answered, trained = await train_steps(first, range(1, 6))
    finally:
        await crash(first)
    ckpts = tmp_path / "contract" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000003"]
    assert sorted(p.name for p in (ckpts / "journal").iterdir()) == [
        "step_00000004",
        "step_00000005",
    ]
    resumed = resumable_config(tmp_path, weightsync_server, interval=3, resume=True)
    second = await start_trainer(resumed)
    try:
        restored = second.runner.trainer.model.state_dict()
        assert all(torch.equal(trained[k], restored[k]) for k in trained)
        async with make_channel(
            f"127.0.0.1:{second.server.port}", security=PLAINTEXT_LOOPBACK
        ) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            assert (await status(stub)).step == 5
            retry = await stub.Train(request(5))
            assert retry.duplicate and retry.metrics["loss"] == answered[4].metrics["loss"]
            with pytest.raises(grpc.aio.AioRpcError) as other:
                await stub.Train(request(4, wire_micro_batch([5, 7])))
            assert other.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            sixth = await stub.Train(request(6))
        assert sixth.policy_version == 6 and weightsync_server.registry.newest == 6
    finally:
        await second.stop()


async def test_a_trainer_killed_before_its_first_checkpoint_resumes_from_the_journal(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    """No checkpoint yet (interval 3, two steps): `--resume` rebuilds the initial model
    and replays steps 1 and 2 from the journal, to the weights of version 2."""
    first = await start_trainer(resumable_config(tmp_path, weightsync_server, interval=3))
    try:
        _, trained = await train_steps(first, (1, 2))
    finally:
        await crash(first)
    assert not list((tmp_path / "contract" / "checkpoints").glob("step_*"))
    resumed = resumable_config(tmp_path, weightsync_server, interval=3, resume=True)
    second = await start_trainer(resumed)
    try:
        restored = second.runner.trainer.model.state_dict()
        assert all(torch.equal(trained[k], restored[k]) for k in trained)
        assert second.runner.last_step == 2 and weightsync_server.registry.newest == 2
    finally:
        await second.stop()


async def test_a_stopping_trainer_checkpoints_its_last_step(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    """With the journal, the newest checkpoint after a clean stop is the last step, not
    the last multiple of `interval`: `tidal export` and a resumed run start from it."""
    running = await start_trainer(resumable_config(tmp_path, weightsync_server, interval=3))
    try:
        await train_steps(running, range(1, 5))
    finally:
        await running.stop()
    ckpts = tmp_path / "contract" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000003", "step_00000004"]
    assert list((ckpts / "journal").iterdir()) == []  # all covered by the checkpoint of 4


def checkpointed_weights(root: Path, step: int) -> dict[str, torch.Tensor]:
    return state_file.read_state(root / f"step_{step:08d}")["train"]["model"]


# ---- background writes (the default; step_persistence.py): Train(n) answers once
# step n is trained; step n's checkpoint and version follow, checkpoint first, versions in
# step order, each exactly the weights of its step although the next step was already
# computing; a stopping trainer finishes them.


async def test_train_answers_before_the_version_and_the_version_follows_its_checkpoint(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    assert TrainerRunConfig().trainer.background_publish  # the default under test
    running = await start_trainer(run_config(tmp_path, weightsync_server, background=True))
    ckpts = tmp_path / "bg" / "checkpoints"
    registry = weightsync_server.registry
    model = running.runner.trainer.model
    try:
        async with make_channel(
            f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK
        ) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            first = await stub.Train(request(1))
            assert (first.step, first.policy_version, first.duplicate) == (1, 1, False)
            await until(lambda: registry.newest == 1, "version 1")
            # checkpoint before publish: version 1 was registered only after it was complete
            assert (ckpts / "step_00000001").is_dir()
            # steps 2..4 back to back: each next step computes while the previous persists
            answers = [await stub.Train(request(step)) for step in (2, 3, 4)]
            assert [a.policy_version for a in answers] == [2, 3, 4]
            s = await status(stub)
            assert s.step == 4 and s.policy_version in (3, 4)  # the newest *published*
            again = await stub.Train(request(3))  # a retry while 4 may still be persisting
            assert again.duplicate and again.policy_version == 3
            await until(lambda: registry.newest == 4, "version 4")
        # every version is exactly its step's weights, the same as its checkpoint: the
        # next step's update did not run into a checkpoint or version still being written
        for step in (2, 3, 4):  # weightsync keeps the newest three
            published = hf_to_native_state_dict(model, load_version(registry.get(step).manifest)[1])
            saved = checkpointed_weights(ckpts, step)
            assert set(published) <= set(saved)
            assert all(torch.equal(published[k], saved[k]) for k in published), step
        latest = model.state_dict()
        assert all(torch.equal(latest[k], saved[k]) for k in saved)  # saved = step 4's
        second_v = load_version(registry.get(2).manifest)[1]
        fourth_v = load_version(registry.get(4).manifest)[1]
        assert not torch.equal(second_v["model.norm.weight"], fourth_v["model.norm.weight"])

        # a stopping trainer finishes the step it answered: checkpoint and version
        async with make_channel(
            f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK
        ) as channel:
            assert (await pb_grpc.TrainerServiceStub(channel).Train(request(5))).step == 5
    finally:
        await running.stop()
    assert (ckpts / "step_00000005").is_dir() and registry.newest == 5


async def test_a_failed_background_write_stops_the_next_update_and_its_retry_writes_it(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    """Step 1's checkpoint cannot be written (its folder is made a file's child): Train(2)
    is refused UNAVAILABLE naming step 1, before its update, so step 1's state is still
    the one to write; once the folder is back, the retry of Train(2) writes step 1 first
    (checkpoint, then version 1) and trains step 2 on top."""
    running = await start_trainer(run_config(tmp_path, weightsync_server, background=True))
    runner, registry = running.runner, weightsync_server.registry
    assert runner.persistence.checkpoints is not None
    good = runner.persistence.checkpoints.root
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    try:
        async with make_channel(
            f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK
        ) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            runner.persistence.checkpoints.root = blocker / "checkpoints"
            assert (await stub.Train(request(1))).policy_version == 1  # answered: trained
            before = {k: v.clone() for k, v in runner.trainer.model.state_dict().items()}
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Train(request(2))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "step 1 could not be written" in str(refused.value.details())
            after = runner.trainer.model.state_dict()
            assert all(torch.equal(before[k], after[k]) for k in before)  # no update of 2
            assert registry.newest == 0 and runner.trainer.trained_step == 1
            runner.persistence.checkpoints.root = good
            second = await stub.Train(request(2))  # the retry: step 1 written, 2 trained
            assert (second.step, second.policy_version, second.duplicate) == (2, 2, False)
            assert registry.newest >= 1 and (good / "step_00000001").is_dir()
            published = load_version(registry.get(1).manifest)[1]
            saved = checkpointed_weights(good, 1)
            native = hf_to_native_state_dict(runner.trainer.model, published)
            assert all(torch.equal(native[k], saved[k]) for k in native)
            await until(lambda: registry.newest == 2, "version 2")
    finally:
        await running.stop()


async def test_a_full_disk_refuses_the_next_step_as_disk_full_and_leaks_nothing(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    """Step 1's checkpoint meets a full disk (a 64 KiB tmpfs): Train(2) is refused
    RESOURCE_EXHAUSTED `disk full: <path> …` with the `DiskFull` kind (a retry cannot
    help, so the caller stops), before its update, and the failed write left no temp
    folder; once there is space, the retry writes step 1 and trains step 2."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    running = await start_trainer(run_config(tmp_path, weightsync_server, background=True))
    runner = running.runner
    assert runner.persistence.checkpoints is not None
    good = runner.persistence.checkpoints.root
    try:
        async with make_channel(
            f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK
        ) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            runner.persistence.checkpoints.root = tiny / "checkpoints"
            assert (await stub.Train(request(1))).policy_version == 1  # answered: trained
            before = {k: v.clone() for k, v in runner.trainer.model.state_dict().items()}
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Train(request(2))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = str(refused.value.details())
            assert f"disk full: {tiny / 'checkpoints'}" in details and "MiB free" in details
            kinds = [v for k, v in refused.value.trailing_metadata() or () if k == ERROR_KIND_KEY]
            assert kinds == ["DiskFull"]
            after = runner.trainer.model.state_dict()
            assert all(torch.equal(before[k], after[k]) for k in before)  # no update of 2
            assert list((tiny / "checkpoints").iterdir()) == []  # no temp folder left
            runner.persistence.checkpoints.root = good
            second = await stub.Train(request(2))  # the retry: step 1 written, 2 trained
            assert (second.step, second.policy_version, second.duplicate) == (2, 2, False)
            assert (good / "step_00000001").is_dir()
    finally:
        await running.stop()
        subprocess.run(["umount", "-l", str(tiny)], check=False)


async def test_a_last_step_whose_writes_meet_a_full_disk_ends_the_wait_for_its_version(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    """The run's last step meets a full disk after Train answered (background_publish), so
    no next Train comes to be refused: GetStatus reports the failed writes, and the
    orchestrator's wait for that version ends with `DiskFull` within a recheck instead of
    at orchestrator.timeouts.train_s. Once there is space, the next step writes it."""
    with small_disk(tmp_path / "tiny", "64k") as tiny:
        running = await start_trainer(run_config(tmp_path, weightsync_server, background=True))
        persistence = running.runner.persistence
        assert persistence.checkpoints is not None
        good = persistence.checkpoints.root
        client = TrainerClient(f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK)
        delivery = TrainDelivery(client, RecoveryConfig(), timeout_s=600)
        batches = [
            micro_batch_from_proto(wire_micro_batch([6, 9], seed=s), field="b") for s in range(2)
        ]
        try:
            persistence.checkpoints.root = tiny / "checkpoints"
            assert (await delivery.train(1, [batches[0]], sft=False)).policy_version == 1
            with pytest.raises(DiskFull, match=f"disk full: {tiny / 'checkpoints'}"):
                await asyncio.wait_for(delivery.wait_published(1, VersionFeed()), 30)
            async with make_channel(
                f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK
            ) as channel:
                s = await status(pb_grpc.TrainerServiceStub(channel))
                assert s.write_error_disk_full and "MiB free" in s.write_error
                with pytest.raises(DiskFull):  # what a rollout's wait for the version asks
                    await client.check_disk()
                persistence.checkpoints.root = good
                assert (await delivery.train(2, [batches[1]], sft=False)).step == 2
                await until(lambda: weightsync_server.registry.newest == 2, "version 2")
                s = await status(pb_grpc.TrainerServiceStub(channel))
                assert (s.write_error, s.write_error_disk_full) == ("", False)
        finally:
            await client.close()
            await running.stop()


async def test_answering_after_the_publish_a_failed_write_fails_train_and_its_retry_writes_it(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    """`background_publish = false`, the same path: step 1's checkpoint cannot be written,
    so Train(1) fails and version 1 is not published, but the step stays trained; its
    retry writes the checkpoint and then version 1 without training the step again."""
    running = await start_trainer(resumable_config(tmp_path, weightsync_server, interval=1))
    persistence, registry = running.runner.persistence, weightsync_server.registry
    assert persistence.checkpoints is not None and not persistence.background
    good = persistence.checkpoints.root
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    try:
        async with make_channel(
            f"127.0.0.1:{running.server.port}", security=PLAINTEXT_LOOPBACK
        ) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            persistence.checkpoints.root = blocker / "checkpoints"
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Train(request(1))
            s = await status(stub)
            assert (s.step, s.policy_version, s.steps_trained) == (0, 0, 1)
            assert registry.newest == 0 and persistence.trainer.trained_step == 1
            persistence.checkpoints.root = good
            retry = await stub.Train(request(1))
            assert (retry.step, retry.policy_version, retry.duplicate) == (1, 1, False)
            s = await status(stub)
            assert (s.step, s.policy_version, s.steps_trained) == (1, 1, 1)
        published = load_version(registry.get(1).manifest)[1]
        native = hf_to_native_state_dict(persistence.trainer.model, published)
        saved = checkpointed_weights(good, 1)
        assert all(torch.equal(native[k], saved[k]) for k in native)
    finally:
        await running.stop()


async def test_delivery_re_sends_the_steps_a_trainer_that_came_back_behind_lost(
    tmp_path: Path, start_weightsync: Callable[..., Any]
) -> None:
    """A trainer that is back with fewer steps than the orchestrator saw trained, and was
    never seen unreachable (in a run: restarted from an older checkpoint within the
    channel's own UNAVAILABLE retries; here: a fresh trainer on the same address), refuses
    the next step as out of order. TrainDelivery re-sends the lost steps, the very same
    requests, then the step, instead of failing the run."""
    first_ws = await start_weightsync(tmp_path / "a" / "weights")
    first = await start_trainer(run_config(tmp_path / "a", first_ws))
    address = f"127.0.0.1:{first.server.port}"
    client = TrainerClient(address, security=PLAINTEXT_LOOPBACK)
    delivery = TrainDelivery(client, RecoveryConfig(), timeout_s=30)
    batches = [
        micro_batch_from_proto(wire_micro_batch([6, 9], seed=s), field="b") for s in range(4)
    ]
    try:
        for step in (1, 2):
            await delivery.train(step, [batches[step]], sft=False)
        # Started before the first trainer stops, so the kernel cannot hand its port to
        # this server (gRPC binds with SO_REUSEPORT: both would listen on one address).
        second_ws = await start_weightsync(tmp_path / "b" / "weights")
        await first.stop()
        config = run_config(tmp_path / "b", second_ws)
        config.endpoints.trainer = address
        second = await start_trainer(config)
        try:
            await client.wait_serving(10)  # connected: Train(3) reaches the new trainer
            assert await client.last_step() == 0
            result = await delivery.train(3, [batches[3]], sft=False)
            assert result.step == 3 and not result.duplicate
            assert delivery.resent_steps == [1, 2] and delivery.outages == 1
            assert await client.last_step() == 3
        finally:
            await second.stop()
    finally:
        await client.close()
