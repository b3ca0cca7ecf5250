"""OrchestratorService.GetProgress on an in-process server, fed by a real ProgressState."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.orchestrator.main import FULL_NAME
from tidal.orchestrator.records.run_status import ProgressState, StepSummary
from tidal.orchestrator.servicer import OrchestratorServicer
from tidal.rpc.v1 import common_pb2, orchestrator_pb2_grpc


@pytest.fixture
def progress() -> ProgressState:
    return ProgressState(total_steps=5, recent_limit=3)


@pytest.fixture
async def channel(progress: ProgressState) -> AsyncIterator[grpc.aio.Channel]:
    binding = ServiceBinding(
        OrchestratorServicer(progress),
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server,
        FULL_NAME,
    )
    server = GrpcServer(
        "127.0.0.1:0", [binding], GrpcConfig(shutdown_grace_s=0.5), security=PLAINTEXT_LOOPBACK
    )
    await server.start()
    async with make_channel(f"127.0.0.1:{server.port}", security=PLAINTEXT_LOOPBACK) as ch:
        yield ch
    await server.stop()


async def _progress(channel: grpc.aio.Channel):  # type: ignore[no-untyped-def]
    stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
    return await stub.GetProgress(common_pb2.StatusRequest(), timeout=5)


async def test_progress_before_any_step_is_starting(channel: grpc.aio.Channel) -> None:
    reply = await _progress(channel)
    assert (reply.step, reply.total_steps, reply.policy_version, reply.state) == (
        0,
        5,
        -1,
        "starting",
    )
    assert list(reply.recent) == []


async def test_progress_reports_finished_steps_oldest_first_and_bounded(
    channel: grpc.aio.Channel, progress: ProgressState
) -> None:
    progress.state = "rl"
    progress.finish_step(StepSummary(1, "warmup", None, 0, 0.5))
    for step in (2, 3, 4):
        progress.finish_step(StepSummary(step, "rl", 0.1 * step, step - 1, 1.0))
    progress.saw_version(4)
    reply = await _progress(channel)
    assert (reply.step, reply.policy_version, reply.state) == (4, 4, "rl")
    assert [s.step for s in reply.recent] == [2, 3, 4]  # recent_limit=3 keeps the newest
    assert [s.phase for s in reply.recent] == ["rl"] * 3
    assert [round(s.reward_mean, 6) for s in reply.recent] == [0.2, 0.3, 0.4]
    assert [s.policy_version for s in reply.recent] == [1, 2, 3]


async def test_warmup_step_without_reward_reports_nan(
    channel: grpc.aio.Channel, progress: ProgressState
) -> None:
    progress.state = "warmup"
    progress.finish_step(StepSummary(1, "warmup", None, 0, 0.5))
    reply = await _progress(channel)
    assert reply.state == "warmup"
    assert math.isnan(reply.recent[0].reward_mean)


async def test_service_reports_serving_on_health(channel: grpc.aio.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=FULL_NAME), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
