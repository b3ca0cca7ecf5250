"""InferenceService: proto ⇄ engine. Errors are raised; the interceptor maps them.

Validation happens here, before anything is queued, and names the offending field.
Checks that need the model (token ids within the vocabulary, prompt within the context)
run after the "no weights yet" check, because the model defines them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from tidal.common.errors import InvalidArgument, Unavailable
from tidal.common.tokenizer import ByteTokenizer
from tidal.inference.engine import Completion, Engine
from tidal.inference.sampling import SamplingParams
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import inference_pb2 as pb
from tidal.rpc.v1 import inference_pb2_grpc as pb_grpc

_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}


def sampling_from_proto(s: pb.SamplingParams) -> SamplingParams:
    if s.max_tokens <= 0:
        raise InvalidArgument("sampling.max_tokens", f"must be > 0, got {s.max_tokens}")
    if s.n < 0:
        raise InvalidArgument("sampling.n", f"must be >= 0 (0 means 1), got {s.n}")
    if not s.temperature >= 0:  # also refuses NaN
        raise InvalidArgument("sampling.temperature", f"must be >= 0, got {s.temperature}")
    if not 0 <= s.top_p <= 1:
        raise InvalidArgument("sampling.top_p", f"must be in [0, 1] (0 means 1), got {s.top_p}")
    if s.top_k < 0:
        raise InvalidArgument("sampling.top_k", f"must be >= 0 (0 disables), got {s.top_k}")
    return SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p if s.top_p > 0 else 1.0,
        top_k=s.top_k,
        n=s.n or 1,
        seed=s.seed if s.HasField("seed") else None,
        stop_token_ids=tuple(s.stop_token_ids),
    )


def completion_to_proto(c: Completion, tokenizer: ByteTokenizer) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        index=c.index,
        prompt_ids=c.prompt_ids,
        token_ids=c.token_ids,
        logprobs=c.logprobs,
        policy_versions=c.policy_versions,
        finish_reason=_FINISH[c.finish_reason],
        text=tokenizer.decode(c.token_ids),
    )


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, engine: Engine, tokenizer: ByteTokenizer, *, replica_id: str) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.replica_id = replica_id

    def _prompt(self, request: pb.GenerateRequest) -> tuple[list[int], str]:
        """Prompt token ids, and the field they came from."""
        if request.prompt_ids and request.prompt:
            raise InvalidArgument("prompt_ids", "exactly one of prompt_ids and prompt must be set")
        if request.prompt:
            return self.tokenizer.encode(request.prompt, add_bos=True), "prompt"
        if not request.prompt_ids:
            raise InvalidArgument("prompt_ids", "the prompt is empty; set prompt_ids or prompt")
        return list(request.prompt_ids), "prompt_ids"

    def _check_against_model(self, prompt_ids: list[int], field: str, s: SamplingParams) -> None:
        status = self.engine.status()
        if status.policy_version < 0:
            raise Unavailable("no weights loaded yet; retry once the first version is served")
        vocab, context = status.vocab_size, status.max_seq_len
        for i, token in enumerate(prompt_ids):
            if not 0 <= token < vocab:
                raise InvalidArgument(f"prompt_ids[{i}]", f"{token} is outside [0, {vocab})")
        if len(prompt_ids) >= context:
            raise InvalidArgument(
                field,
                f"{len(prompt_ids)} tokens leave no room to generate: the model's "
                f"max_seq_len is {context}",
            )
        for i, token in enumerate(s.stop_token_ids):
            if not 0 <= token < vocab:
                raise InvalidArgument(
                    f"sampling.stop_token_ids[{i}]", f"{token} is outside [0, {vocab})"
                )

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        prompt_ids, field = self._prompt(request)
        params = sampling_from_proto(request.sampling)
        self._check_against_model(prompt_ids, field, params)
        trace.get_current_span().set_attributes(
            {"prompt.tokens": len(prompt_ids), "sampling.n": params.n}
        )
        async for completion in self.engine.generate(prompt_ids, params):
            yield completion_to_proto(completion, self.tokenizer)

    async def GetStatus(
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.InferenceStatus:
        s = self.engine.status()
        return pb.InferenceStatus(
            policy_version=s.policy_version,
            running=s.running,
            queued=s.queued,
            generated_tokens=s.generated_tokens,
            tokens_per_s=s.tokens_per_s,
            model=s.model,
            vocab_size=s.vocab_size,
            max_seq_len=s.max_seq_len,
            replica_id=self.replica_id,
        )
