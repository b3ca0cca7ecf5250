"""InferenceService over real in-process servers: weight-sync, then inference watching it.

Each test publishes a tiny model (tied embeddings, published without `lm_head.weight`,
as the trainer does) through the real weight-sync servicer and starts the real inference
service (`start_inference`, what `serve` runs) on a free loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidal.common.config.shared import Endpoints, GrpcConfig, RunSection, TelemetryConfig
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.config import SecurityConfig
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.inference.config import InferenceConfig, InferenceRunConfig
from tidal.inference.decode_attention import native_decode_pays
from tidal.inference.main import RunningInference, not_serving_if_ended, start_inference
from tidal.models.args import DecoderArgs
from tidal.models.cpu_features import bf16_support
from tidal.models.hf_checkpoint import load_hf_folder, publishable_state_dict
from tidal.models.layers import DecoderLM
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import inference_pb2 as pb
from tidal.rpc.v1 import inference_pb2_grpc as pb_grpc
from tidal.text.agreement import TokenizerMismatch, check_agreement
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import write_version
from tidal.weights.manifest import VersionEvent, WeightManifest
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

from ..hf_folders import qwen3_folder

__all__ = ["qwen3_folder"]

ARGS = DecoderArgs(
    vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64
)
REPLICA = "inference-test"
TOK = ByteTokenizer()


def write_model(root: Path, version: int) -> WeightManifest:
    torch.manual_seed(version)
    model = DecoderLM(ARGS)
    model.init_weights(std=0.3)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    return write_version(
        root, version=version, step=version, state_dict=state, config=ARGS.to_hf_config()
    )


async def publish(ws: Any, version: int) -> WeightManifest:
    manifest = write_model(ws.root, version)
    client = WeightSyncClient(ws.address, security=PLAINTEXT_LOOPBACK)
    await client.publish(manifest)
    await client.close()
    return manifest


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@dataclass
class Inference:
    running: RunningInference
    stub: pb_grpc.InferenceServiceStub
    health: health_pb2_grpc.HealthStub

    async def status(self) -> pb.InferenceStatus:
        return await self.stub.GetStatus(common_pb2.StatusRequest())

    async def serving(self) -> bool:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=""))
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def generate(self, **fields: object) -> list[pb.GenerateResponse]:
        replies = [r async for r in self.stub.Generate(pb.GenerateRequest(**fields))]
        return sorted(replies, key=lambda r: r.index)

    async def at_version(self, version: int) -> None:
        async def check() -> bool:
            return (await self.status()).policy_version == version

        await eventually(check)


def inference_config(weightsync: Any, tmp_path: Path, tokenizer: str) -> InferenceRunConfig:
    return InferenceRunConfig(
        run=RunSection(output_dir=tmp_path, tokenizer=tokenizer),
        endpoints=Endpoints(weightsync=weightsync.address, inference="127.0.0.1:0"),
        grpc=GrpcConfig(shutdown_grace_s=0.2),
        security=SecurityConfig(mode="plaintext"),  # in-process, loopback only
        telemetry=TelemetryConfig(traces_file=False),
        inference=InferenceConfig(device="cpu", replica_id=REPLICA),
    )


@contextlib.asynccontextmanager
async def serving_inference(config: InferenceRunConfig) -> AsyncIterator[Inference]:
    running = await start_inference(config)
    # A plain channel: the service channel's retry policy would retry UNAVAILABLE answers.
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    yield Inference(
        running, pb_grpc.InferenceServiceStub(channel), health_pb2_grpc.HealthStub(channel)
    )
    await channel.close()
    await running.server.stop()
    await running.close()


@pytest.fixture
async def inference(weightsync_server: Any, tmp_path: Path) -> AsyncIterator[Inference]:
    """The service with the byte tokenizer (no model folder: "auto" means bytes)."""
    config = inference_config(weightsync_server, tmp_path, "auto")
    async with serving_inference(config) as i:
        yield i


@pytest.fixture
async def ready(weightsync_server: Any, inference: Inference) -> Inference:
    await publish(weightsync_server, 0)
    await inference.at_version(0)
    return inference


SAMPLING = pb.SamplingParams(max_tokens=8, temperature=1.0, n=4, seed=3)


async def test_unavailable_and_not_serving_until_first_version(
    weightsync_server: Any, inference: Inference
) -> None:
    assert not await inference.serving()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await inference.generate(prompt="hi", sampling=SAMPLING)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (await inference.status()).policy_version == -1
    await publish(weightsync_server, 0)
    await eventually(inference.serving)
    assert len(await inference.generate(prompt="hi", sampling=SAMPLING)) == 4


async def test_generate_returns_n_consistent_completions(ready: Inference) -> None:
    replies = await ready.generate(prompt="hi", sampling=SAMPLING)
    assert [r.index for r in replies] == [0, 1, 2, 3]
    for r in replies:
        assert list(r.prompt_ids) == [TOK.bos_id, *b"hi"]
        assert len(r.token_ids) == len(r.logprobs) == len(r.policy_versions) == 8
        assert set(r.policy_versions) == {0}
        assert all(lp <= 0 for lp in r.logprobs)
        assert r.finish_reason == pb.FINISH_REASON_LENGTH
        assert r.text == TOK.decode(r.token_ids)
    again = await ready.generate(prompt="hi", sampling=SAMPLING)
    assert [list(r.token_ids) for r in again] == [list(r.token_ids) for r in replies]  # seeded


async def test_stop_token_ends_generation(ready: Inference) -> None:
    greedy = pb.SamplingParams(max_tokens=10, temperature=0.0)
    (full,) = await ready.generate(prompt_ids=[TOK.bos_id, 7, 8], sampling=greedy)
    stop = full.token_ids[3]
    greedy.stop_token_ids.append(stop)
    (stopped,) = await ready.generate(prompt_ids=[TOK.bos_id, 7, 8], sampling=greedy)
    first = list(full.token_ids).index(stop)
    assert list(stopped.token_ids) == list(full.token_ids)[: first + 1]
    assert stopped.finish_reason == pb.FINISH_REASON_STOP


GOOD = pb.SamplingParams(max_tokens=4)
BAD_REQUESTS = [
    ("prompt_ids", pb.GenerateRequest(prompt_ids=[1], prompt="a", sampling=GOOD)),
    ("prompt_ids", pb.GenerateRequest(sampling=GOOD)),
    ("prompt_ids[3]", pb.GenerateRequest(prompt_ids=[1, 2, 3, 300], sampling=GOOD)),
    ("prompt_ids[0]", pb.GenerateRequest(prompt_ids=[-1], sampling=GOOD)),
    ("prompt_ids", pb.GenerateRequest(prompt_ids=[1] * ARGS.max_seq_len, sampling=GOOD)),
    ("prompt", pb.GenerateRequest(prompt="x" * ARGS.max_seq_len, sampling=GOOD)),
    ("sampling.max_tokens", pb.GenerateRequest(prompt="a")),
    ("sampling.n", pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, n=-1))),
    ("sampling.n", pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, n=0))),
    (
        "sampling.max_tokens",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=ARGS.max_seq_len + 1)),
    ),
    (
        "sampling.top_p",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, top_p=0.0)),
    ),
    (
        "sampling.min_p",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, min_p=1.5)),
    ),
    (
        "sampling.stop[1]",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, stop=["x", ""])),
    ),
    (
        "sampling.temperature",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, temperature=-1)),
    ),
    (
        "sampling.top_p",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, top_p=1.5)),
    ),
    (
        "sampling.top_p",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, top_p=-0.1)),
    ),
    (
        "sampling.top_k",
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=4, top_k=-1)),
    ),
    (
        "sampling.stop_token_ids[0]",
        pb.GenerateRequest(
            prompt="a", sampling=pb.SamplingParams(max_tokens=4, stop_token_ids=[999])
        ),
    ),
]


async def test_bad_inputs_are_invalid_argument_naming_the_field(ready: Inference) -> None:
    for field, request in BAD_REQUESTS:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [r async for r in ready.stub.Generate(request)]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert err.value.details().startswith(f"{field}:"), (field, err.value.details())
    assert len(await ready.generate(prompt="ok", sampling=SAMPLING)) == 4  # still serving


async def test_cancelled_call_leaves_the_server_serving(ready: Inference) -> None:
    call = ready.stub.Generate(
        pb.GenerateRequest(prompt="a", sampling=pb.SamplingParams(max_tokens=50, n=16))
    )
    await asyncio.sleep(0.05)
    call.cancel()
    assert len(await ready.generate(prompt="b", sampling=SAMPLING)) == 4


async def test_new_version_is_loaded_acked_and_traced(
    weightsync_server: Any, ready: Inference, span_exporter: InMemorySpanExporter
) -> None:
    earlier = len(span_exporter.get_finished_spans())  # the exporter lives for the session
    await publish(weightsync_server, 1)
    await ready.at_version(1)
    status = await ready.status()
    assert (status.replica_id, status.vocab_size, status.max_seq_len) == (REPLICA, 264, 64)
    # The engine's choice, for the operator: inference.dtype "auto" is bf16 where native.
    native = bf16_support().native
    linears = f"cpu onednn-packed {'bf16' if native else 'fp32'}"
    attention = "native paged" if native_decode_pays() else "sdpa"
    assert status.kernels == f"{linears}; decode attention {attention}"
    assert (status.tokenizer.name, status.tokenizer.vocab_size) == ("byte", 259)
    assert REPLICA in weightsync_server.registry.get(1).loaded_by
    (reply,) = await ready.generate(prompt="hi", sampling=pb.SamplingParams(max_tokens=3))
    assert set(reply.policy_versions) == {1}
    # the load of version 1 joined the publish's trace
    publish_trace = weightsync_server.registry.get(1).trace_context["traceparent"].split("-")[1]
    loads = [
        s
        for s in span_exporter.get_finished_spans()[earlier:]
        if s.name == "inference.load_weights" and s.attributes["weights.version"] == 1
    ]
    assert [f"{s.context.trace_id:032x}" for s in loads] == [publish_trace]
    prefills = [s for s in span_exporter.get_finished_spans() if s.name == "inference.prefill"]
    assert prefills[-1].links  # linked to the Generate span that asked for it


async def test_corrupt_or_misfit_versions_are_skipped_and_old_one_served(
    weightsync_server: Any,
    ready: Inference,
) -> None:
    corrupt = write_model(weightsync_server.root, 5)
    weights = Path(corrupt.location) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    misfit_args = DecoderArgs(264, 48, 1, 4, 2, 64, 64)
    misfit = write_version(
        weightsync_server.root,
        version=6,
        step=6,
        state_dict={
            k: v for k, v in DecoderLM(misfit_args).state_dict().items() if "lm_head" not in k
        },
        config=misfit_args.to_hf_config(),
    )
    watcher = ready.running.watcher
    assert not await watcher.load(VersionEvent(corrupt))
    assert not await watcher.load(VersionEvent(misfit))
    assert watcher.skipped == [5, 6]
    assert (await ready.status()).policy_version == 0
    (reply,) = await ready.generate(prompt="hi", sampling=pb.SamplingParams(max_tokens=3))
    assert set(reply.policy_versions) == {0}


async def test_a_version_failing_unforeseen_is_skipped_and_the_next_one_loads(
    weightsync_server: Any, ready: Inference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception no `except` foresaw (here a RuntimeError injected into the real
    engine's first load) used to end the reload task: health stayed SERVING and no later
    version was ever loaded. Now that version is skipped and the next one loads."""
    engine = ready.running.engine
    real_update = engine.update_weights
    calls = 0

    async def fails_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected: a failure nobody foresaw")
        return await real_update(*args, **kwargs)

    monkeypatch.setattr(engine, "update_weights", fails_once)
    await publish(weightsync_server, 1)
    await publish(weightsync_server, 2)
    await ready.at_version(2)  # the watcher went on past the failed version
    assert ready.running.watcher.skipped == [1]
    assert await ready.serving()


async def test_a_watcher_task_that_ends_turns_health_not_serving(ready: Inference) -> None:
    async def dies() -> None:
        raise RuntimeError("watcher bug")

    task = asyncio.create_task(dies())
    with contextlib.suppress(RuntimeError):
        await task
    assert await ready.serving()
    not_serving_if_ended(task, ready.running.server)
    for _ in range(50):
        if not await ready.serving():
            break
        await asyncio.sleep(0.02)
    assert not await ready.serving()


async def test_watch_reconnects_after_weightsync_restart(
    weightsync_server: Any, ready: Inference
) -> None:
    await weightsync_server.server.stop()
    await asyncio.sleep(0.3)  # the watch stream breaks; the watcher backs off and retries
    binding = ServiceBinding(
        WeightSyncServicer(weightsync_server.registry, chunk_bytes=1 << 16),
        add_to_server,
        "tidal.rpc.v1.WeightSyncService",
    )
    restarted = GrpcServer(
        weightsync_server.address,
        [binding],
        GrpcConfig(shutdown_grace_s=0.2),
        security=PLAINTEXT_LOOPBACK,
    )
    await restarted.start()
    try:
        await publish(weightsync_server, 1)
        await ready.at_version(1)
    finally:
        await restarted.stop()


async def test_64_concurrent_streaming_clients_are_all_served(ready: Inference) -> None:
    async def client(i: int) -> list[pb.GenerateResponse]:
        sampling = pb.SamplingParams(
            max_tokens=6, temperature=1.0, n=1 + i % 2, seed=i, ignore_eos=True
        )
        request = pb.GenerateRequest(prompt=f"client {i}", sampling=sampling, stream=True)
        return [r async for r in ready.stub.Generate(request)]

    streams = await asyncio.gather(*(client(i) for i in range(64)))
    for i, pieces in enumerate(streams):
        by_index: dict[int, list[pb.GenerateResponse]] = {}
        for piece in pieces:
            by_index.setdefault(piece.index, []).append(piece)
        assert sorted(by_index) == list(range(1 + i % 2))
        for mine in by_index.values():
            assert len(mine) > 1  # streamed in pieces, not one message at the end
            assert all(p.finish_reason == pb.FINISH_REASON_UNSPECIFIED for p in mine[:-1])
            assert mine[-1].finish_reason == pb.FINISH_REASON_LENGTH
            assert sum(len(p.token_ids) for p in mine) == 6
    status = await ready.status()
    assert status.kv_slots_total == 128 and status.kv_slots_used == 0 and status.running == 0


async def test_model_logprobs_and_stop_strings_over_the_wire(ready: Inference) -> None:
    greedy = pb.SamplingParams(max_tokens=12, temperature=0.0)
    (full,) = await ready.generate(prompt="hi", sampling=greedy)
    stop = full.text[4:6]
    sampling = pb.SamplingParams(
        max_tokens=12, temperature=0.0, stop=[stop], return_model_logprobs=True
    )
    (stopped,) = await ready.generate(prompt="hi", sampling=sampling)
    assert stopped.finish_reason == pb.FINISH_REASON_STOP
    assert stopped.text.endswith(stop) and full.text.startswith(stopped.text)
    assert len(stopped.model_logprobs) == len(stopped.token_ids)
    assert list(stopped.model_logprobs) == pytest.approx(list(stopped.logprobs))  # greedy


async def test_version_published_mid_generation_is_picked_up_between_steps(
    weightsync_server: Any, ready: Inference
) -> None:
    # Fixed lengths: the byte tokenizer's EOS (257) is in this model's vocabulary, and the
    # reload's timing decides the tokens, so generate through it.
    sampling = pb.SamplingParams(
        max_tokens=ARGS.max_seq_len - 4, temperature=1.0, n=4, seed=1, ignore_eos=True
    )
    request = pb.GenerateRequest(prompt_ids=[TOK.bos_id, 1, 2], sampling=sampling, stream=True)
    pieces: list[pb.GenerateResponse] = []
    published = False
    async for piece in ready.stub.Generate(request):
        pieces.append(piece)
        if not published:  # the first tokens are out: publish while the rest is generated
            await publish(weightsync_server, 1)
            published = True
    by_index: dict[int, list[int]] = {}
    for piece in pieces:
        by_index.setdefault(piece.index, []).extend(piece.policy_versions)
    assert sorted(by_index) == [0, 1, 2, 3]  # no completion lost
    for versions in by_index.values():
        assert len(versions) == ARGS.max_seq_len - 4
        assert versions == sorted(versions) and versions[0] == 0
    assert any(v[-1] == 1 for v in by_index.values())  # the reload landed mid-generation
    assert (await ready.status()).policy_version == 1


async def publish_folder(ws: Any, folder: Path) -> None:
    """Version 0 from a Hugging Face folder, as a trainer starting from it publishes it."""
    model = load_hf_folder(folder, impl="custom")
    config = json.loads((folder / "config.json").read_text())
    manifest = write_version(
        ws.root, version=0, step=0, state_dict=publishable_state_dict(model), config=config
    )
    client = WeightSyncClient(ws.address, security=PLAINTEXT_LOOPBACK)
    await client.publish(manifest)
    await client.close()


async def test_a_model_folder_is_served_with_its_own_tokenizer(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    tok = HFTokenizer.from_folder(qwen3_folder)
    config = inference_config(weightsync_server, tmp_path, str(qwen3_folder))
    async with serving_inference(config) as inference:
        await publish_folder(weightsync_server, qwen3_folder)
        await inference.at_version(0)
        status = await inference.status()
        sampling = pb.SamplingParams(max_tokens=10, temperature=1.0, n=2, seed=5)
        replies = await inference.generate(prompt="東京は", sampling=sampling)
        streamed = [
            r
            async for r in inference.stub.Generate(
                pb.GenerateRequest(prompt="東京は", sampling=sampling, stream=True)
            )
        ]
    assert status.model.startswith("qwen3-2x32 (") and status.vocab_size == tok.vocab_size
    # it reports the tokenizer, and an orchestrator tokenizing with bytes refuses to drive it
    assert (status.tokenizer.vocab_size, tuple(status.tokenizer.eos_ids)) == (
        tok.vocab_size,
        tok.eos_ids,
    )
    check_agreement(tok, status.tokenizer, peer="inference")
    with pytest.raises(TokenizerMismatch, match=f"{tok.vocab_size} ids against this service's 259"):
        check_agreement(ByteTokenizer(), status.tokenizer, peer="inference")
    for r in replies:
        assert list(r.prompt_ids) == tok.encode("東京は")  # Qwen adds no BOS
        assert r.text == tok.decode(r.token_ids)
        pieces = [p for p in streamed if p.index == r.index]
        assert "".join(p.text for p in pieces) == r.text
        stopped_at_eos = r.token_ids[-1] in tok.eos_ids
        assert stopped_at_eos == (r.finish_reason == pb.FINISH_REASON_STOP)


async def test_a_tokenizer_larger_than_the_model_is_refused_and_reported(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    config = inference_config(weightsync_server, tmp_path, str(qwen3_folder))
    async with serving_inference(config) as inference:
        await publish(weightsync_server, 0)  # ARGS: 264 embedding rows

        async def reported() -> bool:
            return bool((await inference.status()).load_error)

        await eventually(reported)
        status = await inference.status()
        assert not await inference.serving()
    assert status.policy_version == -1
    assert "tokenizer" in status.load_error and "only 264 rows" in status.load_error
    assert f"has {HFTokenizer.from_folder(qwen3_folder).vocab_size} ids" in status.load_error


async def test_occupancy_is_pushed_and_its_stream_ends_at_shutdown_within_the_grace(
    weightsync_server: Any, tmp_path: Path
) -> None:
    """WatchOccupancy answers the current figures at once; a watcher left open does not
    hold a stopping server for its grace period: the stream ends with the shutdown."""
    config = inference_config(weightsync_server, tmp_path, "auto")
    config.grpc.shutdown_grace_s = 30.0
    running = await start_inference(config)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        call = pb_grpc.InferenceServiceStub(channel).WatchOccupancy(
            pb.WatchOccupancyRequest(min_interval_ms=10, heartbeat_ms=50)
        )
        reports = [await call.read() for _ in range(3)]  # the figures, then heartbeats
        assert [r.sequence for r in reports] == [1, 2, 3]
        assert reports[0].replica_id == REPLICA and reports[0].queued == 0
        started = time.monotonic()
        await running.server.stop()
        assert time.monotonic() - started < 5.0  # not the 30 s grace
        while await call.read() is not grpc.aio.EOF:  # reports sent before the end
            pass
        assert await call.code() == grpc.StatusCode.OK  # it ended cleanly
    finally:
        await channel.close()
        await running.close()
