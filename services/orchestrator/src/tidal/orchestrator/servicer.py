"""OrchestratorService: the run's progress, proto ⇄ `ProgressState`."""

from __future__ import annotations

import math

import grpc

from tidal.orchestrator.records.run_status import ProgressState
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import orchestrator_pb2 as pb
from tidal.rpc.v1 import orchestrator_pb2_grpc as pb_grpc


def progress_to_proto(progress: ProgressState) -> pb.Progress:
    return pb.Progress(
        step=progress.step,
        total_steps=progress.total_steps,
        policy_version=progress.policy_version,
        state=progress.state,
        recent=[
            pb.StepSummary(
                step=s.step,
                phase=s.phase,
                # proto3 doubles have no null: a step without rewards reports NaN.
                reward_mean=math.nan if s.reward_mean is None else s.reward_mean,
                policy_version=s.policy_version,
                seconds=s.seconds,
            )
            for s in progress.recent
        ],
    )


class OrchestratorServicer(pb_grpc.OrchestratorServiceServicer):
    def __init__(self, progress: ProgressState) -> None:
        self.progress = progress

    async def GetProgress(
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.Progress:
        # StatusRequest has no fields, so there is nothing to validate.
        return progress_to_proto(self.progress)
