"""TrainerService over a real in-process gRPC server, publishing to a real weightsync."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tidal.batch.wire import micro_batch_from_proto, payload_sha256
from tidal.common.channel import make_channel
from tidal.common.errors import FailedPrecondition
from tidal.common.tensors import encode_array
from tidal.orchestrator.peers import PeerError
from tidal.orchestrator.trainer_client import TrainerClient
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc
from tidal.trainer.checkpoint import CheckpointManager
from tidal.trainer.config import TrainerRunConfig
from tidal.trainer.service import RunningTrainer, start_trainer
from tidal.weights.folder import load_version

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


def run_config(tmp_path: Path, weightsync: RunningWeightSync) -> TrainerRunConfig:
    return TrainerRunConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path), "name": "contract"},
            "endpoints": {"trainer": "127.0.0.1:0", "weightsync": weightsync.address},
            "grpc": {"shutdown_grace_s": 0.5},
            "trainer": {"model": TINY_MODEL, "device": "cpu", "publish_dir": str(weightsync.root)},
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
    async with make_channel(f"127.0.0.1:{trainer.server.port}") as channel:
        yield pb_grpc.TrainerServiceStub(channel)


def micro_batch(lengths: list[int], *, seed: int = 0, **override: np.ndarray) -> pb.MicroBatch:
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    starts = np.cumsum(lengths) - lengths
    positions = np.arange(total) - np.repeat(starts, lengths)
    mask = (positions >= 2).astype(np.float32)  # two prompt tokens per sample
    arrays = {
        "input_ids": rng.integers(0, 259, total).astype(np.int32),
        "position_ids": positions.astype(np.int32),
        "sample_lengths": np.array(lengths, dtype=np.int32),
        "loss_mask": mask,
        "advantages": (np.repeat(rng.standard_normal(len(lengths)), lengths) * mask).astype(
            np.float32
        ),
        "behaviour_logprobs": (-5.6 * mask).astype(np.float32),
        **override,
    }
    return pb.MicroBatch(**{name: encode_array(a) for name, a in arrays.items()})


def request(step: int, *batches: pb.MicroBatch, loss: int = PG) -> pb.TrainRequest:
    return pb.TrainRequest(step=step, micro_batches=batches or [micro_batch([6, 9])], loss=loss)


async def status(stub: pb_grpc.TrainerServiceStub) -> pb.TrainerStatus:
    return await stub.GetStatus(common_pb2.StatusRequest())


async def test_startup_publishes_version_0_and_serves(
    trainer: RunningTrainer, weightsync_server: RunningWeightSync, stub: pb_grpc.TrainerServiceStub
) -> None:
    assert weightsync_server.registry.newest == 0
    async with make_channel(f"127.0.0.1:{trainer.server.port}") as channel:
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
    first = await stub.Train(request(1, micro_batch([6, 9]), micro_batch([12], seed=1)))
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
    await stub.Train(request(1, micro_batch([6, 9])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Train(request(1, micro_batch([6, 9], seed=7)))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "step 1 was already trained with other data" in err.value.details()
    s = await status(stub)
    assert (s.steps_trained, s.duplicates_answered) == (1, 0)
    assert weightsync_server.registry.newest == 1


async def test_payload_sha256_that_does_not_match_the_data_is_invalid_argument(
    stub: pb_grpc.TrainerServiceStub,
) -> None:
    sent = request(1)
    sent.payload_sha256 = payload_sha256(sent.loss, request(1, micro_batch([12])).micro_batches)
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
    await stub.Train(request(1, micro_batch([6, 9], seed=3)))
    own = micro_batch_from_proto(micro_batch([6, 9]), field="own")
    client = TrainerClient(f"127.0.0.1:{trainer.server.port}")
    try:
        with pytest.raises(PeerError, match="step 1 was already trained with other data"):
            await client.train(1, [own], sft=False, timeout=30)
        same = micro_batch_from_proto(micro_batch([6, 9], seed=3), field="same")
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
                micro_batch([6, 9]),
                micro_batch([4], input_ids=np.array([256, 1, 999, 2], dtype=np.int32)),
            ),
            "micro_batches[1].input_ids",
        ),
        (
            lambda: request(1, micro_batch([6, 9], advantages=np.zeros(14, dtype=np.float32))),
            "micro_batches[0].advantages",
        ),
        (
            lambda: request(1, micro_batch([6, 9], sample_lengths=np.array([6, 8], np.int32))),
            "micro_batches[0].sample_lengths",
        ),
        (
            lambda: request(1, micro_batch([4], input_ids=np.array([1, 2, 3, 4], np.int64))),
            "micro_batches[0].input_ids.dtype",
        ),
        (lambda: request(1, micro_batch([40])), "micro_batches[0].sample_lengths"),
        (lambda: request(1, pb.MicroBatch()), "micro_batches[0].input_ids"),
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
    tmp_path: Path, weightsync: RunningWeightSync, **update: object
) -> TrainerRunConfig:
    config = run_config(tmp_path, weightsync)
    ckpt = config.trainer.ckpt.model_copy(update={"interval": 2})
    trainer = config.trainer.model_copy(update={"ckpt": ckpt})
    return config.model_copy(update={"trainer": trainer, **update})


async def test_resume_continues_after_the_checkpointed_step(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    first = await start_trainer(resumable_config(tmp_path, weightsync_server))
    try:
        async with make_channel(f"127.0.0.1:{first.server.port}") as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            for step in (1, 2):
                await stub.Train(request(step))
            trained = {k: v.clone() for k, v in first.runner.trainer.model.state_dict().items()}
    finally:
        await first.stop()
    assert CheckpointManager(tmp_path / "contract" / "checkpoints", keep_last=1).latest() == (
        tmp_path / "contract" / "checkpoints" / "step_00000002"
    )

    second = await start_trainer(resumable_config(tmp_path, weightsync_server, resume=True))
    try:
        restored = second.runner.trainer.model.state_dict()
        assert all(torch.equal(trained[k], restored[k]) for k in trained)
        async with make_channel(f"127.0.0.1:{second.server.port}") as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            assert (await status(stub)).step == 2
            third = await stub.Train(request(3))
        assert third.policy_version == 3 and weightsync_server.registry.newest == 3
    finally:
        await second.stop()


async def test_resume_refuses_versions_newer_than_the_checkpoint(
    tmp_path: Path, weightsync_server: RunningWeightSync
) -> None:
    first = await start_trainer(resumable_config(tmp_path, weightsync_server))
    try:
        async with make_channel(f"127.0.0.1:{first.server.port}") as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            for step in (1, 2, 3):  # checkpoint at 2, version 3 exists only in weightsync
                await stub.Train(request(step))
    finally:
        await first.stop()
    with pytest.raises(FailedPrecondition, match="version 3, newer than the checkpoint of step 2"):
        await start_trainer(resumable_config(tmp_path, weightsync_server, resume=True))
