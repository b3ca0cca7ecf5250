"""Bad-input suite: every RPC's fields driven with boundary and absurd values (Hypothesis).

One real stack per module (weightsync, the trainer publishing version 0 to it, inference
loading it), each a real servicer on an in-process grpc.aio server on a free loopback port,
on one event loop owned by the module fixture. Every generated request is invalid by
construction, so every answer must be an error that is neither INTERNAL nor OK and names
the field; afterwards each service still answers health SERVING and the process's RSS
stays within a bound. Requests over an RPC's size limit are RESOURCE_EXHAUSTED. Bulk
requests from a caller that may not make them are refused before their body costs the
server memory (a trainer in a process of its own, token mode and mTLS). The server limits
every service shares are tested in tests/unit/common/test_server.py. Inference also
serves its OpenAI endpoint, whose bodies must each be answered below 500 with an
OpenAI-style error, logging nothing.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import math
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tidal.common.config.shared import Endpoints, GrpcConfig, RunSection, TelemetryConfig
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.limits import max_chunk_bytes
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.config import SecurityConfig
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.inference.config import (
    InferenceConfig,
    InferenceRunConfig,
    OpenAIHttpConfig,
    RequestLimits,
)
from tidal.inference.main import RunningInference, start_inference
from tidal.rpc.v1 import common_pb2, weightsync_pb2_grpc
from tidal.rpc.v1 import inference_pb2 as ipb
from tidal.rpc.v1 import inference_pb2_grpc as ipb_grpc
from tidal.rpc.v1 import trainer_pb2 as tpb
from tidal.rpc.v1 import trainer_pb2_grpc as tpb_grpc
from tidal.rpc.v1 import weightsync_pb2 as wpb
from tidal.trainer.config import TrainerConfig, TrainerRunConfig
from tidal.trainer.main import RunningTrainer, start_trainer
from tidal.weightsync.config import StreamTransport
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

from ..helpers.micro_batches import wire_micro_batch
from ..tls_fixtures import role_security

TINY_MODEL = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64}
MAX_SEQ_LEN = 32
VOCAB = 264
LIMITS = RequestLimits(max_prompt_bytes=4096, max_prompt_tokens=1000)
TOKEN_BUDGET = 4096
RSS_GROWTH_LIMIT = 400 * 1024 * 1024
DENIED = grpc.StatusCode.PERMISSION_DENIED
MAX_BODY = 64 * 1024
FEW = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@dataclass(repr=False)
class Stack:
    loop: asyncio.AbstractEventLoop
    channels: dict[str, grpc.aio.Channel]
    inference: ipb_grpc.InferenceServiceStub
    trainer: tpb_grpc.TrainerServiceStub
    weightsync: weightsync_pb2_grpc.WeightSyncServiceStub
    version0: wpb.WeightVersion
    rss_start: int
    openai_url: str
    inference_metrics: CollectorRegistry | None

    def __repr__(self) -> str:  # Hypothesis prints it with every failing example
        return "Stack()"

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout=60))

    def refused(self, call: Callable[[], Awaitable[Any]]) -> grpc.aio.AioRpcError:
        """The error `call` must end in; fails on OK and on INTERNAL."""

        async def go() -> Any:
            result = call()
            if hasattr(result, "__aiter__"):
                return [r async for r in result]
            return await result

        try:
            answer = self.run(go())
        except grpc.aio.AioRpcError as err:
            assert err.code() != grpc.StatusCode.INTERNAL, err.details()
            return err
        raise AssertionError(f"an invalid request was answered OK: {answer!r:.200}")

    def post(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str] | None = None,
        *,
        chunked: bool = False,
    ) -> tuple[int, bytes]:
        """POST raw bytes (as JSON unless `headers` say otherwise, chunked without a
        Content-Length when asked) to the OpenAI endpoint; (status, body)."""

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 4096):
                yield body[start : start + 4096]

        async def go() -> tuple[int, bytes]:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    self.openai_url + path,
                    data=pieces() if chunked else body,
                    headers={"Content-Type": "application/json", **(headers or {})},
                ) as reply,
            ):
                return reply.status, await reply.read()

        return self.run(go())

    def assert_serving(self) -> None:
        for name, channel in self.channels.items():
            reply = self.run(
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=10
                )
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
        assert rss_bytes() - self.rss_start < RSS_GROWTH_LIMIT


def assert_names(err: grpc.aio.AioRpcError, field: str) -> None:
    details = err.details() or ""
    assert field in details, (err.code(), details)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    loop = asyncio.new_event_loop()
    # The main thread's current loop: grpc.aio objects made outside a running loop look it
    # up, and an earlier test's asyncio.run() in this process leaves none set.
    asyncio.set_event_loop(loop)
    root = tmp_path_factory.mktemp("bad-inputs")
    weights = root / "weights"
    weights.mkdir()
    grpc_config = GrpcConfig(shutdown_grace_s=0.2)

    async def start() -> tuple[GrpcServer, RunningTrainer, RunningInference]:
        registry = VersionRegistry(weights, keep_last=3)
        binding = ServiceBinding(
            # The stream transport, so UploadWeights reaches its manifest checks too.
            WeightSyncServicer(registry, chunk_bytes=1 << 16, transport=StreamTransport()),
            add_to_server,
            "tidal.rpc.v1.WeightSyncService",
        )
        ws = GrpcServer("127.0.0.1:0", [binding], grpc_config, security=PLAINTEXT_LOOPBACK)
        await ws.start()
        ws_address = f"127.0.0.1:{ws.port}"
        trainer = await start_trainer(
            TrainerRunConfig.model_validate(
                {
                    "run": {"output_dir": str(root), "name": "bad"},
                    "endpoints": {"trainer": "127.0.0.1:0", "weightsync": ws_address},
                    "grpc": {"shutdown_grace_s": 0.2},
                    "security": {"mode": "plaintext"},  # in-process, loopback only
                    "trainer": {
                        "model": {**TINY_MODEL, "max_seq_len": MAX_SEQ_LEN, "vocab_size": VOCAB},
                        "device": "cpu",
                        "publish_dir": str(weights),
                        "max_tokens_per_step": TOKEN_BUDGET,
                    },
                }
            )
        )
        inference = await start_inference(
            InferenceRunConfig(
                run=RunSection(output_dir=root),
                endpoints=Endpoints(weightsync=ws_address, inference="127.0.0.1:0"),
                grpc=grpc_config,
                security=SecurityConfig(mode="plaintext"),  # in-process, loopback only
                telemetry=TelemetryConfig(traces_file=False),
                inference=InferenceConfig(
                    device="cpu",
                    replica_id="bad-inputs",
                    max_batch_size=4,
                    kv_cache_mb=16,
                    limits=LIMITS,
                    http=OpenAIHttpConfig(enabled=True, max_body_bytes=MAX_BODY),
                ),
            )
        )
        return ws, trainer, inference

    ws, trainer, inference = loop.run_until_complete(start())
    ports = {"weightsync": ws.port, "trainer": trainer.server.port, "inference": inference.port}

    async def connect() -> dict[str, grpc.aio.Channel]:  # channels belong to the loop
        return {n: grpc.aio.insecure_channel(f"127.0.0.1:{p}") for n, p in ports.items()}

    channels = loop.run_until_complete(connect())
    ws_stub = weightsync_pb2_grpc.WeightSyncServiceStub(channels["weightsync"])
    inference_stub = ipb_grpc.InferenceServiceStub(channels["inference"])

    async def ready() -> wpb.WeightVersion:
        for _ in range(600):
            status = await inference_stub.GetStatus(common_pb2.StatusRequest())
            if status.policy_version == 0:
                return await ws_stub.GetVersion(wpb.GetVersionRequest(version=0))
            await asyncio.sleep(0.05)
        raise AssertionError("inference never loaded version 0")

    version0 = loop.run_until_complete(ready())
    yield Stack(
        loop,
        channels,
        inference_stub,
        tpb_grpc.TrainerServiceStub(channels["trainer"]),
        ws_stub,
        version0,
        rss_bytes(),
        inference.http.url if inference.http is not None else "",
        inference.server.metrics.registry if inference.server.metrics is not None else None,
    )

    async def stop() -> None:
        for channel in channels.values():
            await channel.close()
        await inference.server.stop()
        await inference.close()
        await trainer.stop()
        await ws.stop()

    loop.run_until_complete(stop())
    loop.close()
    asyncio.set_event_loop(None)


# --- inference: Generate -------------------------------------------------------------

NAN, INF = math.nan, math.inf
int64s = st.integers(-(1 << 63), (1 << 63) - 1)
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1  # the proto's int32 fields hold no more
bad_floats = st.sampled_from([NAN, INF, -INF])


def sampling(**fields: Any) -> ipb.SamplingParams:
    base: dict[str, Any] = {"max_tokens": 1}
    base.update(fields)
    return ipb.SamplingParams(**base)


BAD_SAMPLING = st.one_of(
    st.tuples(
        st.just("max_tokens"),
        st.one_of(st.integers(I32_MIN, 0), st.integers(LIMITS.max_tokens + 1, I32_MAX)),
    ),
    st.tuples(
        st.just("n"),
        st.one_of(st.integers(I32_MIN, 0), st.integers(LIMITS.max_n + 1, I32_MAX)),
    ),
    st.tuples(
        st.just("temperature"),
        st.one_of(
            bad_floats,
            st.floats(max_value=-1e-6),
            st.floats(min_value=LIMITS.max_temperature * 1.01),
        ),
    ),
    st.tuples(
        st.just("top_p"),
        st.one_of(bad_floats, st.floats(max_value=0.0), st.floats(min_value=1.0001)),
    ),
    st.tuples(
        st.just("top_k"),
        st.one_of(st.integers(I32_MIN, -1), st.integers(VOCAB + 1, I32_MAX)),
    ),
    st.tuples(
        st.just("min_p"),
        st.one_of(bad_floats, st.floats(max_value=-1e-6), st.floats(min_value=1.0001)),
    ),
    st.tuples(
        st.just("stop"),
        st.one_of(
            st.lists(st.text(min_size=1, max_size=4), min_size=LIMITS.max_stop + 1, max_size=200),
            st.lists(st.just(""), min_size=1, max_size=3),
            st.lists(
                st.text(min_size=LIMITS.max_stop_bytes + 1, max_size=2000), min_size=1, max_size=2
            ),
        ),
    ),
    st.tuples(
        st.just("stop_token_ids"),
        st.one_of(
            st.lists(st.integers(VOCAB, I32_MAX), min_size=1, max_size=5),
            st.lists(st.integers(I32_MIN, -1), min_size=1, max_size=5),
            st.lists(
                st.integers(0, VOCAB - 1),
                min_size=LIMITS.max_stop_token_ids + 1,
                max_size=LIMITS.max_stop_token_ids + 50,
            ),
        ),
    ),
)


@FEW
@given(bad=BAD_SAMPLING)
def test_generate_refuses_every_bad_sampling_field(stack: Stack, bad: tuple[str, Any]) -> None:
    field, value = bad
    request = ipb.GenerateRequest(prompt_ids=[1, 2, 3], sampling=sampling(**{field: value}))
    err = stack.refused(lambda: stack.inference.Generate(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_names(err, f"sampling.{field}")
    stack.assert_serving()


BAD_PROMPTS = st.one_of(
    st.tuples(st.just("prompt_ids"), st.lists(st.integers(VOCAB, I32_MAX), min_size=1, max_size=8)),
    st.tuples(st.just("prompt_ids"), st.lists(st.integers(I32_MIN, -1), min_size=1, max_size=8)),
    st.tuples(
        st.just("prompt_ids"),
        st.lists(st.integers(0, VOCAB - 1), min_size=MAX_SEQ_LEN, max_size=5000),
    ),
    st.tuples(st.just("prompt"), st.text(min_size=MAX_SEQ_LEN, max_size=LIMITS.max_prompt_bytes)),
    st.tuples(st.just("prompt"), st.text(min_size=LIMITS.max_prompt_bytes + 1, max_size=20_000)),
)


@FEW
@given(bad=BAD_PROMPTS)
def test_generate_refuses_every_bad_prompt(stack: Stack, bad: tuple[str, Any]) -> None:
    field, value = bad
    request = ipb.GenerateRequest(**{field: value}, sampling=sampling())
    err = stack.refused(lambda: stack.inference.Generate(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_names(err, field)
    stack.assert_serving()


def test_huge_prompt_is_refused_by_size_and_health_answers_meanwhile(stack: Stack) -> None:
    """A prompt over the transport limit never reaches Python; one over
    max_prompt_bytes is refused by its length before tokenizing, naming the field."""
    huge = ipb.GenerateRequest(prompt="x" * (5 << 20), sampling=sampling())
    err = stack.refused(lambda: stack.inference.Generate(huge))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    long = ipb.GenerateRequest(prompt="é" * (3 << 20 >> 1), sampling=sampling())
    err = stack.refused(lambda: stack.inference.Generate(long))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "inference.limits" in err.details()
    assert_names(err, "prompt")
    stack.assert_serving()


def test_valid_boundary_values_are_served(stack: Stack) -> None:
    """The caps are inclusive: the largest allowed values are accepted."""
    request = ipb.GenerateRequest(
        prompt_ids=[1] * (MAX_SEQ_LEN - 1),
        sampling=sampling(
            temperature=LIMITS.max_temperature,
            top_p=1.0,
            top_k=VOCAB,
            min_p=1.0,
            n=2,
            stop=["x" * LIMITS.max_stop_bytes] * LIMITS.max_stop,
            seed=(1 << 63) - 1,
        ),
    )

    async def go() -> list[ipb.GenerateResponse]:
        return [r async for r in stack.inference.Generate(request)]

    assert len(stack.run(go())) == 2


# --- trainer: Train --------------------------------------------------------------------

WIRE = {
    "input_ids": np.int32,
    "position_ids": np.int32,
    "sample_lengths": np.int32,
    "loss_mask": np.float32,
    "advantages": np.float32,
    "behaviour_logprobs": np.float32,
}


TENSORS = st.sampled_from(sorted(WIRE))
BAD_TENSOR = st.one_of(
    st.tuples(st.just("shape"), st.lists(st.integers(1 << 40, 1 << 62), min_size=1, max_size=3)),
    st.tuples(st.just("shape"), st.lists(st.integers(-(1 << 62), -1), min_size=1, max_size=3)),
    st.tuples(st.just("shape"), st.lists(st.integers(0, 4), min_size=9, max_size=12)),
    # Shapes whose product wraps to 0 in int64, sent with no data (once answered INTERNAL).
    st.tuples(
        st.just("wrapping shape"),
        st.lists(st.sampled_from([1 << 62, 1 << 32, 4, 16]), min_size=2, max_size=3).filter(
            lambda dims: math.prod(dims) >= 1 << 64
        ),
    ),
    st.tuples(
        st.just("dtype"),
        st.sampled_from(["", "float64", "int64", "bfloat16", "complex", "x" * 300]),
    ),
    st.tuples(st.just("data"), st.binary(max_size=64)),
)


@FEW
@given(name=TENSORS, bad=BAD_TENSOR)
@example(name="advantages", bad=("wrapping shape", [1 << 62, 4]))
def test_train_refuses_every_bad_tensor(stack: Stack, name: str, bad: tuple[str, Any]) -> None:
    part, value = bad
    batch = wire_micro_batch([5, 4])
    tensor = getattr(batch, name)
    if part in ("shape", "wrapping shape"):
        del tensor.shape[:]
        tensor.shape.extend(value)
        if part == "wrapping shape":
            tensor.data = b""
    elif part == "dtype":
        tensor.dtype = value
    else:  # data that does not match the shape (never the right bytes by chance)
        tensor.data = value if value != tensor.data else value + b"\0"
    request = tpb.TrainRequest(step=1, micro_batches=[batch], loss=tpb.LOSS_KIND_POLICY_GRADIENT)
    err = stack.refused(lambda: stack.trainer.Train(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_names(err, f"micro_batches[0].{name}")
    stack.assert_serving()


BAD_TRAIN = st.one_of(
    st.tuples(st.just("step"), st.integers(-(1 << 63), 0)),
    st.tuples(st.just("loss"), st.integers(I32_MIN, I32_MAX).filter(lambda k: k not in (1, 2))),
    st.tuples(st.just("payload_sha256"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("micro_batches"), st.integers(TOKEN_BUDGET + 1, 1 << 62)),
)


@FEW
@given(bad=BAD_TRAIN)
def test_train_refuses_every_bad_field(stack: Stack, bad: tuple[str, Any]) -> None:
    field, value = bad
    fields: dict[str, Any] = {"step": 1, "loss": tpb.LOSS_KIND_POLICY_GRADIENT}
    batch = wire_micro_batch([5, 4])
    if field == "micro_batches":  # a step claiming more tokens than the budget, no data
        del batch.input_ids.shape[:]
        batch.input_ids.shape.append(value)
    else:
        fields[field] = value
    request = tpb.TrainRequest(micro_batches=[batch], **fields)
    err = stack.refused(lambda: stack.trainer.Train(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_names(err, field)
    if field == "micro_batches":
        assert "trainer.max_tokens_per_step" in err.details()
    stack.assert_serving()


@FEW
@given(rank=st.one_of(st.integers(I32_MIN, -1), st.integers(1, I32_MAX)))
def test_train_refuses_a_rank_outside_the_data_parallel_degree(stack: Stack, rank: int) -> None:
    """A one-process trainer has one data-parallel rank: 0 (also what an unset rank reads)."""
    batch = wire_micro_batch([5, 4])
    batch.rank = rank
    request = tpb.TrainRequest(
        step=1, micro_batches=[wire_micro_batch([5, 4]), batch], loss=tpb.LOSS_KIND_POLICY_GRADIENT
    )
    err = stack.refused(lambda: stack.trainer.Train(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_names(err, "micro_batches[1].rank")
    stack.assert_serving()


def test_a_step_over_the_token_budget_is_refused_whole(stack: Stack) -> None:
    """Micro-batches each within the budget, together over it: refused naming the field."""
    count = TOKEN_BUDGET // 9 + 1  # 9 tokens each
    request = tpb.TrainRequest(
        step=1, micro_batches=[wire_micro_batch([5, 4])] * count, loss=tpb.LOSS_KIND_POLICY_GRADIENT
    )
    err = stack.refused(lambda: stack.trainer.Train(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("micro_batches: the step carries")
    assert "trainer.max_tokens_per_step" in err.details()
    stack.assert_serving()


@pytest.mark.parametrize(
    ("service", "method"),
    [
        ("trainer", "/tidal.rpc.v1.TrainerService/GetStatus"),
        ("trainer", "/tidal.rpc.v1.TrainerService/Train"),  # a large step: TrainStream
        ("weightsync", "/tidal.rpc.v1.WeightSyncService/GetVersion"),
        ("inference", "/tidal.rpc.v1.InferenceService/GetStatus"),
    ],
)
def test_every_server_receives_at_most_max_request_bytes(
    stack: Stack, service: str, method: str
) -> None:
    """Whatever a server hosts, a message over grpc.max_request_bytes is refused from its
    length prefix."""
    call = stack.channels[service].unary_unary(method, request_serializer=bytes)
    big = b"\x0a\x80\x80\x80\x03" + b"x" * (6 << 20)  # unknown field 1, 6 MiB
    err = stack.refused(lambda: call(big))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    stack.assert_serving()


CHUNK_LIMIT = max_chunk_bytes(GrpcConfig())
MAX_STEP_BYTES = TrainerConfig().max_step_bytes


def train_chunk_cases() -> dict[str, tuple[list[tpb.TrainChunk], grpc.StatusCode, str]]:
    """Chunk streams each breaking one rule: (chunks, status, the field it names)."""
    raw = tpb.TrainRequest(
        step=1, micro_batches=[wire_micro_batch([5, 4])], loss=tpb.LOSS_KIND_POLICY_GRADIENT
    ).SerializeToString()
    n = len(raw)
    bad, exhausted = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
    big = CHUNK_LIMIT + 1  # under the receive limit: the servicer's own check answers
    return {
        "chunk over the limit": (
            [tpb.TrainChunk(total_bytes=big, data=bytes(big))],
            exhausted,
            "data",
        ),
        "out of order": (
            [
                tpb.TrainChunk(total_bytes=n, offset=0, data=raw[:5]),
                tpb.TrainChunk(total_bytes=n, offset=9, data=raw[9:]),
            ],
            bad,
            "offset",
        ),
        "total over the cap": (
            [tpb.TrainChunk(total_bytes=MAX_STEP_BYTES + 1, data=raw)],
            exhausted,
            "total_bytes",
        ),
        "total changed": (
            [
                tpb.TrainChunk(total_bytes=n, offset=0, data=raw[:5]),
                tpb.TrainChunk(total_bytes=n + 1, offset=5, data=raw[5:]),
            ],
            bad,
            "total_bytes",
        ),
        "ends short": ([tpb.TrainChunk(total_bytes=n + 1, data=raw)], bad, "total_bytes"),
        "no chunk": ([], bad, "total_bytes"),
        "no request": ([tpb.TrainChunk(total_bytes=3, data=b"\xff\xff\xff")], bad, "data"),
    }


@pytest.mark.parametrize("case", list(train_chunk_cases()))
def test_train_stream_refuses_chunks_that_break_its_rules(stack: Stack, case: str) -> None:
    chunks, code, field = train_chunk_cases()[case]
    err = stack.refused(lambda: stack.trainer.TrainStream(iter(chunks)))
    assert err.code() == code, err.details()
    assert (err.details() or "").startswith(f"{field}:"), err.details()
    stack.assert_serving()


BAD_WATCH = st.one_of(
    st.tuples(
        st.just("min_interval_ms"),
        st.builds(
            dict,
            min_interval_ms=st.one_of(
                st.integers(I32_MIN, -1), st.integers(1, 9), st.integers(10_001, I32_MAX)
            ),
        ),
    ),
    st.tuples(
        st.just("heartbeat_ms"),
        st.one_of(
            st.builds(
                dict, heartbeat_ms=st.one_of(st.integers(I32_MIN, -1), st.integers(60_001, I32_MAX))
            ),
            # shorter than the interval it must repeat
            st.integers(11, 10_000).map(lambda i: {"min_interval_ms": i, "heartbeat_ms": i - 1}),
        ),
    ),
)


@FEW
@given(bad=BAD_WATCH)
def test_watch_occupancy_refuses_bad_intervals(stack: Stack, bad: tuple[str, Any]) -> None:
    field, fields = bad
    request = ipb.WatchOccupancyRequest(**fields)
    err = stack.refused(lambda: stack.inference.WatchOccupancy(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith(f"{field}:"), err.details()
    stack.assert_serving()


# --- weightsync ------------------------------------------------------------------------


@FEW
@given(
    field=st.sampled_from(["offset", "path", "version"]),
    offset=st.one_of(st.integers(-(1 << 63), -1), st.integers(1 << 30, (1 << 63) - 1)),
    text=st.text(min_size=1, max_size=300),
    version=st.integers(1, (1 << 63) - 1),  # < 0 means the newest; 0 exists
)
def test_fetch_weights_refuses_bad_offsets_paths_versions(
    stack: Stack, field: str, offset: int, text: str, version: int
) -> None:
    first = stack.version0.manifest.files[0].path
    request = {
        "offset": wpb.FetchWeightsRequest(version=0, path=first, offset=offset),
        "path": wpb.FetchWeightsRequest(version=0, path=text + "\x00"),
        "version": wpb.FetchWeightsRequest(version=version),
    }[field]
    err = stack.refused(lambda: stack.weightsync.FetchWeights(request))
    assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert_names(err, field if field != "version" else "version")
    stack.assert_serving()


manifests = st.builds(
    wpb.WeightManifest,
    version=int64s,
    step=int64s,
    format=st.text(max_size=20),
    location=st.one_of(st.text(max_size=100), st.just("/"), st.just("../../etc")),
    files=st.lists(
        st.builds(
            wpb.WeightFile, path=st.text(max_size=50), size=int64s, sha256=st.text(max_size=70)
        ),
        max_size=4,
    ),
    base_version=int64s,
)


@FEW
@given(manifest=manifests)
def test_publish_and_upload_refuse_absurd_manifests(
    stack: Stack, manifest: wpb.WeightManifest
) -> None:
    err = stack.refused(lambda: stack.weightsync.Publish(wpb.PublishRequest(manifest=manifest)))
    assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    assert_names(err, "manifest")

    async def upload() -> Any:
        async def messages() -> Any:
            yield wpb.UploadWeightsRequest(manifest=manifest)
            for f in manifest.files:
                yield wpb.UploadWeightsRequest(
                    chunk=wpb.WeightChunk(path=f.path, offset=f.size, data=b"x")
                )

        return await stack.weightsync.UploadWeights(messages())

    err = stack.refused(upload)
    assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    assert_names(err, "manifest")
    stack.assert_serving()


def upload_chunk_cases() -> dict[str, tuple[wpb.WeightChunk, grpc.StatusCode, str]]:
    """A chunk of a 100-byte file breaking one rule: (chunk, status, the field it names)."""
    big = CHUNK_LIMIT + 1
    return {
        "chunk over the limit": (
            wpb.WeightChunk(path="model.safetensors", data=bytes(big)),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "chunk.data",
        ),
        "out of order": (
            wpb.WeightChunk(path="model.safetensors", offset=50, data=bytes(10)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "chunk.offset",
        ),
        "past the file's size": (
            wpb.WeightChunk(path="model.safetensors", offset=0, data=bytes(101)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "chunk.data",
        ),
    }


@pytest.mark.parametrize("case", list(upload_chunk_cases()))
def test_upload_weights_refuses_chunks_that_break_its_rules(stack: Stack, case: str) -> None:
    chunk, code, field = upload_chunk_cases()[case]
    weights = wpb.WeightFile(path="model.safetensors", size=100, sha256="0" * 64)
    manifest = wpb.WeightManifest(version=1, step=1, format="safetensors", files=[weights])
    messages = [wpb.UploadWeightsRequest(manifest=manifest), wpb.UploadWeightsRequest(chunk=chunk)]
    err = stack.refused(lambda: stack.weightsync.UploadWeights(iter(messages)))
    assert err.code() == code, err.details()
    assert (err.details() or "").startswith(f"{field}:"), err.details()
    stack.assert_serving()


@pytest.mark.parametrize("sizes", [[1 << 40], [1 << 37] * 3], ids=["one file", "several"])
def test_upload_weights_refuses_a_manifest_over_the_total_cap(
    stack: Stack, sizes: list[int]
) -> None:
    """Files adding up to more than `weightsync.transport.max_upload_bytes` (256 GiB): refused
    before a byte is written, naming the field, and no folder appears."""
    root = Path(stack.version0.manifest.location).parent
    before = sorted(p.name for p in root.iterdir())
    files = [
        wpb.WeightFile(path=f"part-{i}.safetensors", size=size, sha256="0" * 64)
        for i, size in enumerate(sizes)
    ]
    manifest = wpb.WeightManifest(version=1, step=1, format="safetensors", files=files)
    messages = [wpb.UploadWeightsRequest(manifest=manifest)]
    err = stack.refused(lambda: stack.weightsync.UploadWeights(iter(messages)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert (err.details() or "").startswith("manifest.files:"), err.details()
    assert sorted(p.name for p in root.iterdir()) == before
    stack.assert_serving()


@FEW
@given(replica=st.text(max_size=100), version=int64s, role=st.integers(I32_MIN, I32_MAX))
def test_replica_rpcs_refuse_unknown_replicas_versions_and_roles(
    stack: Stack, replica: str, version: int, role: int
) -> None:
    ws = stack.weightsync
    for call in (
        lambda: ws.BeginLoad(wpb.BeginLoadRequest(replica_id=replica + "?", version=version)),
        lambda: ws.AckLoaded(wpb.AckLoadedRequest(replica_id=replica + "?", version=version)),
    ):
        err = stack.refused(call)
        assert err.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert_names(err, "replica_id")
    if version < -1:
        err = stack.refused(
            lambda: ws.Watch(wpb.WatchRequest(replica_id=replica, after_version=version))
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert_names(err, "after_version")
    if role not in (1, 2):
        err = stack.refused(lambda: ws.JoinSync(wpb.JoinSyncRequest(role=role)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert_names(err, "role")
    stack.assert_serving()


# --- bulk requests from callers that may not make them --------------------------------

SERVED_TRAINER = Path(__file__).parents[1] / "helpers" / "served_trainer.py"
ATTACK_BYTES = 128 * 1024 * 1024
ATTACKERS = 4
# Half of one attack body: growth under it shows no body was buffered whole, with room
# for the allocator's and gRPC's own noise in a process earlier tests have used.
ATTACK_RSS_LIMIT = ATTACK_BYTES // 2


def proc_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def bulk_requests() -> tuple[bytes, bytes]:
    """A well-formed Train request and UploadWeights message of ~ATTACK_BYTES (zeros)."""
    ids = common_pb2.Tensor(dtype="int32", shape=[ATTACK_BYTES // 4], data=bytes(ATTACK_BYTES))
    train = tpb.TrainRequest(step=1, micro_batches=[tpb.MicroBatch(input_ids=ids)])
    chunk = wpb.WeightChunk(path="model.safetensors", data=bytes(ATTACK_BYTES))
    upload = wpb.UploadWeightsRequest(chunk=chunk)
    return train.SerializeToString(), upload.SerializeToString()


def attacker_channel(mode: str, tls: Path, address: str) -> grpc.aio.Channel:
    """Token mode: TLS and no token; mTLS: the operator's certificate (a run identity)."""
    options = [("grpc.max_send_message_length", 2 * ATTACK_BYTES)]
    if mode == "token":
        ca = grpc.ssl_channel_credentials((tls / "ca.pem").read_bytes())
        return grpc.aio.secure_channel(address, ca, options=options)
    credentials = role_security(tls, "operator", mode).channel_credentials()
    assert credentials is not None
    return grpc.aio.secure_channel(address, credentials, options=options)


async def codes_of(calls: Iterable[Awaitable[Any]]) -> list[grpc.StatusCode]:
    async def code(call: Awaitable[Any]) -> grpc.StatusCode:
        try:
            await call
        except grpc.aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    return list(await asyncio.gather(*map(code, calls)))


async def refused_bulk_calls(
    mode: str, tls: Path, trainer: str, weightsync: str
) -> list[list[grpc.StatusCode]]:
    """The codes of ATTACKERS concurrent Train calls, then of as many UploadWeights."""
    train, chunk = bulk_requests()
    async with attacker_channel(mode, tls, trainer) as channel:
        call = channel.unary_unary("/tidal.rpc.v1.TrainerService/Train", request_serializer=bytes)
        trains = await codes_of(call(train, timeout=20) for _ in range(ATTACKERS))
    async with attacker_channel(mode, tls, weightsync) as channel:
        upload = channel.stream_unary(
            "/tidal.rpc.v1.WeightSyncService/UploadWeights", request_serializer=bytes
        )
        uploads = await codes_of(upload(iter([chunk]), timeout=20) for _ in range(ATTACKERS))
    return [trains, uploads]


async def trains_step_one(mode: str, tls: Path, address: str) -> int:
    async with make_channel(address, security=role_security(tls, "orchestrator", mode)) as ch:
        stub = tpb_grpc.TrainerServiceStub(ch)
        reply = await stub.Train(
            tpb.TrainRequest(
                step=1, micro_batches=[wire_micro_batch([6, 9])], loss=tpb.LOSS_KIND_POLICY_GRADIENT
            )
        )
        return int(reply.policy_version)


@dataclass(frozen=True)
class Served:
    """The served_trainer.py process: its pid, mode and the address of each server."""

    pid: int
    mode: str
    addresses: dict[str, str]


@pytest.fixture(scope="module", params=["token", "mtls"])
def served(
    request: pytest.FixtureRequest, tls_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    mode = request.param
    run = tmp_path_factory.mktemp(f"served-{mode}")
    server = subprocess.Popen(
        [sys.executable, str(SERVED_TRAINER), mode, str(tls_folder), str(run)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        ports = server.stdout.readline().split()
        names = ("trainer", "weightsync", "inference", "orchestrator")
        yield Served(
            server.pid, mode, {n: f"127.0.0.1:{p}" for n, p in zip(names, ports, strict=True)}
        )
    finally:
        server.communicate(timeout=30)  # closes its stdin: it stops


def peak_growth(pid: int, attack: Awaitable[Any]) -> tuple[Any, int]:
    """`attack`'s result and the process's peak RSS growth (bytes) while it ran."""
    before = proc_kib(pid, "VmRSS") * 1024
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(attack)
    finally:
        loop.close()
    return result, proc_kib(pid, "VmHWM") * 1024 - before


CHECK_BYTES = 200 * 1024 * 1024
CHECK_RSS_LIMIT = CHECK_BYTES // 2


async def oversized_checks(
    mode: str, tls: Path, address: str, request: bytes
) -> list[grpc.StatusCode]:
    """The codes of ATTACKERS concurrent health Checks carrying `request`, by a caller with
    no token (token mode) or the operator's certificate (mTLS): health is open."""
    async with attacker_channel(mode, tls, address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes)
        return await codes_of(check(request, timeout=30) for _ in range(ATTACKERS))


@pytest.mark.parametrize("served", ["token"], indirect=True)  # the handshake is all mTLS adds
def test_oversized_health_checks_cost_every_server_little(served: Served, tls_folder: Path) -> None:
    """Health is open to any caller, so its message size is each server's one receive
    limit: four 200 MB Checks are refused RESOURCE_EXHAUSTED and no server (trainer,
    weightsync, inference, orchestrator) grows by their size."""
    request = health_pb2.HealthCheckRequest(service="x" * CHECK_BYTES).SerializeToString()
    growth: dict[str, int] = {}
    for service, address in served.addresses.items():
        attack = oversized_checks(served.mode, tls_folder, address, request)
        codes, growth[service] = peak_growth(served.pid, attack)
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * ATTACKERS, service
    assert max(growth.values()) < CHECK_RSS_LIMIT, {s: g >> 20 for s, g in growth.items()}


async def first_occupancy(
    channel: grpc.aio.Channel,
) -> ipb.Occupancy | grpc.StatusCode:
    """The first report of a WatchOccupancy stream on `channel`, or the status refusing it."""
    call = ipb_grpc.InferenceServiceStub(channel).WatchOccupancy(
        ipb.WatchOccupancyRequest(), timeout=20
    )
    try:
        async for report in call:
            return report
    except grpc.aio.AioRpcError as err:
        return err.code()
    finally:
        call.cancel()
    raise AssertionError("the occupancy stream ended without a report")


async def occupancy_by_caller(tls: Path, address: str) -> dict[str, Any]:
    """Each role's first WatchOccupancy answer (token mode), and a caller with no token's."""
    answers: dict[str, Any] = {}
    for role in ("orchestrator", "operator", "trainer", "inference", "weightsync"):
        async with make_channel(address, security=role_security(tls, role, "token")) as channel:
            answers[role] = await first_occupancy(channel)
    async with attacker_channel("token", tls, address) as channel:
        answers["no token"] = await first_occupancy(channel)
    return answers


@pytest.mark.parametrize("served", ["token"], indirect=True)
def test_watch_occupancy_streams_to_the_orchestrator_and_operators_only(
    served: Served, tls_folder: Path
) -> None:
    loop = asyncio.new_event_loop()
    try:
        answers = loop.run_until_complete(
            occupancy_by_caller(tls_folder, served.addresses["inference"])
        )
    finally:
        loop.close()
    for role in ("orchestrator", "operator"):
        report = answers[role]
        assert isinstance(report, ipb.Occupancy), (role, report)
        assert report.sequence == 1 and report.replica_id and 0 <= report.kv_usage <= 1
    assert [answers[r] for r in ("trainer", "inference", "weightsync")] == [DENIED] * 3
    assert answers["no token"] == grpc.StatusCode.UNAUTHENTICATED


def test_bulk_requests_of_unauthorized_callers_are_refused_before_their_body(
    served: Served, tls_folder: Path
) -> None:
    """Concurrent 128 MB Train and UploadWeights calls from an identity that may not make
    them are refused (their role, or their size: whichever gRPC sees first), and the
    server's memory does not grow by their bodies; then the orchestrator still trains."""
    started = time.monotonic()
    attack = refused_bulk_calls(
        served.mode, tls_folder, served.addresses["trainer"], served.addresses["weightsync"]
    )
    codes, growth = peak_growth(served.pid, attack)
    expected = grpc.StatusCode.UNAUTHENTICATED if served.mode == "token" else DENIED
    for call_codes in codes:
        assert set(call_codes) <= {expected, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert time.monotonic() - started < 20
    assert growth < ATTACK_RSS_LIMIT, f"server RSS grew {growth >> 20} MiB"
    loop = asyncio.new_event_loop()
    try:
        trained = loop.run_until_complete(
            trains_step_one(served.mode, tls_folder, served.addresses["trainer"])
        )
    finally:
        loop.close()
    assert trained == 1


# --- inference: the OpenAI endpoint's bodies ----------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
OPENAI_FIELDS = (  # noqa: SIM905
    "prompt messages max_tokens max_completion_tokens n temperature top_p top_k min_p seed "
    "stop stop_token_ids logprobs top_logprobs stream stream_options ignore_eos best_of echo "
    "chat_template_kwargs tools tool_choice parallel_tool_calls"
).split()
openai_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["tidal", "other"])},
    optional=dict.fromkeys(OPENAI_FIELDS, json_values),
)
CHARSETS = ["utf-8", "UTF8", "ascii", "latin-1", "utf-16", "x-no-such", "zlib", "rot13", ""]
PATHS = ["/completions", "/chat/completions"]


def assert_openai_error(status: int, reply: bytes) -> None:
    """Below 500, and a refusal is OpenAI's error shape with a message."""
    assert status < 500, (status, reply[:300])
    if status >= 400:
        error = json.loads(reply)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert "internal" not in error["message"], error


@pytest.fixture
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.ERROR, logger="tidal.inference"):
        yield
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@FEW
@given(body=openai_bodies, path=st.sampled_from(PATHS))
@example(body={"model": "tidal", "temperature": 10**400, "prompt": "a"}, path=PATHS[0])
@example(
    body={"model": "tidal", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
    path=PATHS[1],
)
def test_openai_bodies_of_any_shape_are_never_a_server_error(
    stack: Stack, no_tracebacks: None, body: dict[str, Any], path: str
) -> None:
    if body.get("model") == "tidal" and "max_tokens" not in body:
        body["max_tokens"] = 2  # a valid body generates: keep it short
    assert_openai_error(*stack.post(path, json.dumps(body).encode()))


@FEW
@given(
    raw=st.one_of(
        st.binary(max_size=256),
        st.text(max_size=256).map(str.encode),
        st.integers(1, MAX_BODY // 2 - 8).map(lambda d: b"[" * d + b"]" * d),
        st.integers(1, MAX_BODY // 2 - 8).map(lambda d: b'{"a":' * d + b"1" + b"}" * d),
        st.integers(0, 2 * MAX_BODY).map(
            lambda n: json.dumps({"model": "tidal", "prompt": "x" * n, "max_tokens": 1}).encode()
        ),
    ),
    charset=st.sampled_from(CHARSETS) | st.text(st.characters(min_codepoint=33, max_codepoint=126)),
    encoding=st.sampled_from(["", "identity", "gzip", "deflate", "br"]),
    chunked=st.booleans(),
    path=st.sampled_from(PATHS),
)
@example(
    raw=b"[" * 30_000 + b"]" * 30_000, charset="utf-8", encoding="", chunked=True, path=PATHS[0]
)
@example(raw=b"not gzip", charset="", encoding="gzip", chunked=False, path=PATHS[0])
@example(
    raw=b'{"model": "tidal", "prompt": "a"}',
    charset="x-no-such",
    encoding="",
    chunked=False,
    path=PATHS[0],
)
@example(
    raw=b'{"model": "tidal", "prompt": "\\ud800"}',
    charset="utf-8",
    encoding="",
    chunked=False,
    path=PATHS[0],
)
@example(
    raw=b'{"model": "tidal", "n": 1' + b"0" * 5000 + b"}",
    charset="utf-8",
    encoding="",
    chunked=False,
    path=PATHS[0],
)
@example(
    raw=b'{"model": "tidal", "top_p": NaN}',
    charset="utf-8",
    encoding="",
    chunked=False,
    path=PATHS[0],
)
def test_openai_raw_bodies_depths_charsets_and_sizes_are_never_a_server_error(
    stack: Stack,
    no_tracebacks: None,
    raw: bytes,
    charset: str,
    encoding: str,
    chunked: bool,
    path: str,
) -> None:
    headers = {"Content-Type": "application/json" + (f"; charset={charset}" if charset else "")}
    if encoding:
        headers["Content-Encoding"] = encoding
    assert_openai_error(*stack.post(path, raw, headers, chunked=chunked))


ZIP_BOMB = gzip.compress(b'{"model": "tidal", "prompt": "' + b"x" * (16 << 20) + b'"}')


@pytest.mark.parametrize(
    ("raw", "headers", "status", "says"),
    [
        (b"[" * 30_000 + b"]" * 30_000, {}, 400, "nested too deeply"),
        (
            b'{"model": "tidal"}',
            {"Content-Type": "application/json; charset=x-no-such"},
            415,
            "charset",
        ),
        (b'{"model": "tidal", "prompt": "\\udc00"}', {}, 400, "surrogate"),
        (
            b'{"model": "tidal", "prompt": "' + b"x" * MAX_BODY + b'"}',
            {},
            413,
            "inference.http.max_body_bytes",
        ),
        (ZIP_BOMB, {"Content-Encoding": "gzip"}, 415, "send the body uncompressed"),
    ],
)
@pytest.mark.parametrize("chunked", [False, True])
def test_openai_attacks_are_refused_by_name_without_a_traceback(
    stack: Stack,
    no_tracebacks: None,
    raw: bytes,
    headers: dict[str, str],
    status: int,
    says: str,
    chunked: bool,
) -> None:
    got, reply = stack.post("/completions", raw, headers, chunked=chunked)
    assert_openai_error(got, reply)
    assert got == status and says in json.loads(reply)["error"]["message"], reply[:300]
    stack.assert_serving()


MALFORMED_FRAMING = {
    "Content-Length: -1": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "bad chunk size": (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nabc\r\n0\r\n\r\n"
    ),
}


def test_malformed_framing_costs_a_counter_and_a_line_a_minute_not_a_traceback_each(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp refuses these before any handler (so before the API key check); 100 of each
    kind, from one client, must leave at most one short line per kind in the log."""
    host, port = stack.openai_url.removeprefix("http://").removesuffix("/v1").split(":")

    async def send(raw: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(raw)
        reply = await asyncio.wait_for(reader.read(), 10)  # the server closes after a 400
        writer.close()
        return reply

    def counted() -> float:
        assert stack.inference_metrics is not None
        sample = ("tidal_inference_http_errors_total", {"kind": "BadHttpMessage"})
        return stack.inference_metrics.get_sample_value(*sample) or 0.0

    before = counted()
    with caplog.at_level(logging.DEBUG, logger="aiohttp"), caplog.at_level(logging.INFO):
        replies = [stack.run(send(raw)) for raw in MALFORMED_FRAMING.values() for _ in range(100)]
    assert counted() - before == 200
    assert all(r.startswith(b"HTTP/1.0 400 ") or r.startswith(b"HTTP/1.1 400 ") for r in replies)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], caplog.text[:2000]
    assert len(errors) <= len(MALFORMED_FRAMING), [r.getMessage() for r in errors]
    assert len(caplog.text) < 2000, caplog.text[:2000]
    stack.assert_serving()


# The session gateway of agent tasks (tidal.orchestrator.gateway): each attack is refused
# with the status that names it, before any generation. An agent's socket to a service
# port is tested with a real sandboxed agent (tests/unit/orchestrator/gateway/).


async def _no_generation(prompt_ids: list[int], call: int, max_tokens: int, n: int) -> Any:
    raise AssertionError("an attack reached generation")


@pytest.fixture
async def gateway() -> AsyncIterator[Any]:
    from tidal.orchestrator.gateway.server import Gateway
    from tidal.text.byte import ByteTokenizer
    from tidal.text.tool_calls import tool_call_parser

    tokenizer = ByteTokenizer()
    gateway = Gateway(tokenizer, tool_call_parser(tokenizer, "auto"), str, max_body_bytes=1 << 20)
    await gateway.start()
    yield gateway
    await gateway.close()


def _episode(gateway: Any, ttl_s: float = 30.0) -> tuple[Any, str]:
    from tidal.orchestrator.gateway.session import AgentSession
    from tidal.orchestrator.gateway.trace import EpisodeTrace
    from tidal.orchestrator.tasks.base import Problem
    from tidal.text.conversation import ChatRendering

    rendering = ChatRendering(gateway.tokenizer, True)
    session = AgentSession(
        Problem("p", "r"), EpisodeTrace(rendering), _no_generation, 4, 128, 8
    )  # fmt: skip
    return session, gateway.open(session, ttl_s=ttl_s)


async def _post(gateway: Any, path: str, key: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(gateway.url + path, json=body, headers=headers, **kw) as reply,
    ):
        return reply.status, await reply.json()


CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


async def test_gateway_refuses_a_missing_forged_or_expired_key_before_the_body(
    gateway: Any,
) -> None:
    _, live = _episode(gateway)
    _, expiring = _episode(gateway, ttl_s=0.05)
    await asyncio.sleep(0.1)
    for key in ("", "tidal-ep-forged", live + "x", expiring):
        status, reply = await _post(gateway, "/chat/completions", key, CHAT)
        assert status == 401 and reply["error"]["code"] == "invalid_api_key", (key, reply)
    _, key = _episode(gateway)
    gateway.close_session(key)  # the episode ended: its key with it
    assert (await _post(gateway, "/chat/completions", key, CHAT))[0] == 401


async def test_gateway_refuses_another_episodes_key_or_a_forged_session_id(gateway: Any) -> None:
    mine, my_key = _episode(gateway)
    theirs, _ = _episode(gateway)
    for session_id in (theirs.id, "s-000000000000000000000000", "../" + mine.id):
        status, _ = await _post(gateway, f"/sessions/{session_id}/reward", my_key, {"reward": 1})
        assert status in (401, 404), session_id
    assert theirs.reward is None and mine.reward is None


async def test_gateway_takes_one_reward_per_episode(gateway: Any) -> None:
    session, key = _episode(gateway)
    assert (await _post(gateway, f"/sessions/{session.id}/reward", key, {"reward": 0.5}))[0] == 200
    status, reply = await _post(gateway, f"/sessions/{session.id}/reward", key, {"reward": 1.0})
    assert status == 409 and session.reward == 0.5, reply
    for bad in ({"reward": "1"}, {"reward": True}, {}, {"reward": None}):
        other, other_key = _episode(gateway)
        status, reply = await _post(gateway, f"/sessions/{other.id}/reward", other_key, bad)
        assert status == 400 and reply["error"]["param"] == "reward", (bad, reply)


@pytest.mark.parametrize("chunked", [False, True])
async def test_gateway_refuses_a_100_mb_request_without_reading_it(
    gateway: Any, chunked: bool
) -> None:
    _, key = _episode(gateway)
    block = b"x" * (1 << 20)

    async def body() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield block

    data: Any = body() if chunked else b"x" * (100 << 20)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        try:
            async with http.post(
                gateway.url + "/chat/completions", data=data, headers=headers
            ) as r:
                status, reply = r.status, await r.json()
        except aiohttp.ClientError:  # the server closed the connection mid-body: refused
            return
    assert status == 413 and reply["error"]["code"] == "body_too_large", reply


async def test_gateway_chat_fields_are_refused_by_name(gateway: Any) -> None:
    _, key = _episode(gateway)
    bad = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "n": 17}, "n"),
        ({**CHAT, "max_tokens": -1}, "max_tokens"),
        ({**CHAT, "tools": [{"type": "function"}]}, "tools[0].function.name"),
    ]
    for body, field in bad:
        status, reply = await _post(gateway, "/chat/completions", key, body)
        assert status == 400 and reply["error"]["param"] == field, (body, reply)


async def test_gateway_refuses_a_body_that_is_not_strict_json(gateway: Any) -> None:
    _, key = _episode(gateway)
    bodies = [b'{"messages": NaN}', b'{"messages": [', b"[" * 2000 + b"]" * 2000, b'"hi"', b"\xff"]
    for raw in bodies:
        status, reply = await _post(gateway, "/chat/completions", key, data=raw)
        assert status == 400 and reply["error"]["param"] == "body", (raw[:20], reply)


async def test_gateway_lists_its_model_to_an_episodes_key_only(gateway: Any) -> None:
    _, key = _episode(gateway)
    async with aiohttp.ClientSession() as http:
        for path, auth, status in [
            ("/models", "", 401),
            ("/models", "tidal-ep-forged", 401),
            ("/models", key, 200),
            ("/models/tidal", key, 200),
            ("/models/gpt-4o", key, 404),
        ]:
            headers = {"Authorization": f"Bearer {auth}"} if auth else {}
            async with http.get(gateway.url + path, headers=headers) as reply:
                body = await reply.json()
            assert reply.status == status, (path, body)
            if status == 404:
                assert body["error"]["param"] == "model", body
            elif path == "/models" and status == 200:
                assert [m["id"] for m in body["data"]] == ["tidal"], body


async def test_gateway_refuses_more_choices_than_the_episode_has_turns_left(gateway: Any) -> None:
    _, key = _episode(gateway)  # max_calls 4: five choices would pass it
    status, reply = await _post(gateway, "/chat/completions", key, {**CHAT, "n": 5})
    assert status == 429 and "asked for 5 more" in reply["error"]["message"], reply
