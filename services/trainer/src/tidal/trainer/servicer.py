"""TrainerService: proto ⇄ domain (`MicroBatchData`, `StepRunner`). Errors are raised.

Every request is validated in full before it reaches the runner, cheapest checks first
(the step's token count is read from the shapes and held against
`trainer.max_tokens_per_step` before any tensor is decoded): a malformed request is
INVALID_ARGUMENT naming the field, even under a step id already trained. The payload's
sha256 is computed from what arrived (and must equal `payload_sha256` when set), so the
runner can refuse a repeated step id carrying other data. The codec is `tidal.batch`,
the same code the orchestrator encodes with. TrainStream carries the same request in
chunks (`tidal.batch.train_chunks`), checked as it arrives, then trained as Train's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed, validate_micro_batch
from tidal.batch.train_chunks import join_request
from tidal.batch.wire import micro_batch_from_proto, payload_sha256, token_counts
from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import DiskFull, InvalidArgument
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc
from tidal.trainer.runner import StepRunner
from tidal.trainer.service_trainer import LossKind

_LOSS_KINDS: dict[int, LossKind] = {pb.LOSS_KIND_POLICY_GRADIENT: "pg", pb.LOSS_KIND_SFT: "sft"}


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(
        self,
        runner: StepRunner,
        *,
        device: str,
        data_parallel_ranks: int = 1,
        tokenizer: common_pb2.TokenizerInfo | None = None,
        grpc_config: GrpcConfig | None = None,
    ) -> None:
        self.runner = runner
        self.grpc_config = grpc_config or GrpcConfig()
        self.device = device
        self.data_parallel_ranks = data_parallel_ranks
        self.tokenizer = tokenizer or common_pb2.TokenizerInfo()
        """The run's tokenizer, reported so the orchestrator can check it tokenizes alike."""
        model = runner.trainer.config.model
        self.vocab_size = model.vocab_size
        self.max_seq_len = model.max_seq_len
        self.max_tokens_per_step = runner.trainer.config.max_tokens_per_step
        self.max_step_bytes = runner.trainer.config.max_step_bytes

    def _decode(self, request: pb.TrainRequest) -> tuple[list[MicroBatchData], LossKind]:
        if request.step < 1:
            raise InvalidArgument("step", f"steps are 1-indexed, got {request.step}")
        kind = _LOSS_KINDS.get(request.loss)
        if kind is None:
            names = ", ".join(pb.LossKind.Name(k) for k in _LOSS_KINDS)
            raise InvalidArgument("loss", f"must be one of {names}, got {request.loss}")
        if not request.micro_batches:
            raise InvalidArgument("micro_batches", "must hold at least one micro-batch")
        ranks = self.data_parallel_ranks
        for i, message in enumerate(request.micro_batches):
            if not 0 <= message.rank < ranks:
                raise InvalidArgument(
                    f"micro_batches[{i}].rank",
                    f"must be in [0, {ranks}), the trainer's data-parallel ranks; "
                    f"got {message.rank}",
                )
        counts = token_counts(request.micro_batches, field="micro_batches")
        budget = self.max_tokens_per_step
        for i, count in enumerate(counts):  # one absurd shape is named as that field
            if count > budget:
                raise InvalidArgument(
                    f"micro_batches[{i}].input_ids.shape",
                    f"[{count}] tokens, more than the trainer's budget of {budget} per step "
                    "(trainer.max_tokens_per_step)",
                )
        total = sum(counts)
        if total > budget:
            raise InvalidArgument(
                "micro_batches",
                f"the step carries {total} tokens, more than the trainer's budget of "
                f"{budget} (trainer.max_tokens_per_step); send fewer "
                "samples per step or raise the budget",
            )
        batches = []
        for i, message in enumerate(request.micro_batches):
            field = f"micro_batches[{i}]"
            batch = micro_batch_from_packed(micro_batch_from_proto(message, field=field))
            validate_micro_batch(
                batch, field=field, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len
            )
            batches.append(batch)
        if sum(b.num_loss_tokens for b in batches) == 0:
            raise InvalidArgument("micro_batches", "no token of the step has loss_mask 1")
        return batches, kind

    async def Train(
        self, request: pb.TrainRequest, context: grpc.aio.ServicerContext
    ) -> pb.TrainResponse:
        return await self._train(request)

    async def TrainStream(
        self, request_iterator: AsyncIterator[pb.TrainChunk], context: grpc.aio.ServicerContext
    ) -> pb.TrainResponse:
        request = await join_request(
            request_iterator, max_step_bytes=self.max_step_bytes, grpc=self.grpc_config
        )
        return await self._train(request)

    async def _train(self, request: pb.TrainRequest) -> pb.TrainResponse:
        batches, kind = self._decode(request)
        sha = payload_sha256(request.loss, request.micro_batches)
        if request.payload_sha256 and request.payload_sha256 != sha:
            raise InvalidArgument(
                "payload_sha256",
                f"does not match the micro-batches received for step {request.step} "
                f"(sent {request.payload_sha256.hex()[:16]}…, received data {sha.hex()[:16]}…)",
            )
        result = await self.runner.train(request.step, batches, kind, payload_sha256=sha)
        return pb.TrainResponse(
            step=result.step,
            policy_version=result.policy_version,
            metrics=result.metrics,
            duplicate=result.duplicate,
        )

    async def GetStatus(
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.TrainerStatus:
        runner = self.runner
        failed = runner.persistence.failed_writes
        return pb.TrainerStatus(
            step=runner.last_step,
            policy_version=max(runner.policy_version, 0),
            steps_trained=runner.steps_trained,
            duplicates_answered=runner.duplicates_answered,
            num_parameters=runner.trainer.num_parameters,
            model=runner.trainer.describe(),
            device=self.device,
            data_parallel_ranks=self.data_parallel_ranks,
            tokenizer=self.tokenizer,
            write_error="" if failed is None else str(failed),
            write_error_disk_full=isinstance(failed, DiskFull),
        )
