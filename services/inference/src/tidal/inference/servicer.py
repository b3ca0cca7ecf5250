"""InferenceService: proto ⇄ engine. Errors are raised; the interceptor maps them.

Requests are validated here, before anything is queued, by the checks shared with the
OpenAI endpoint (`request_checks`), sizes before the work they cost; a long text prompt is
tokenized in a worker thread. A text prompt is encoded with the tokenizer's own special
tokens; ids pass through untouched. The tokenizer's EOS ids are added to `stop_token_ids`
unless the request sets `ignore_eos`. Cancellation needs no code: grpc cancels the
handler, which closes the engine's generator, which cancels the request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

import grpc
from opentelemetry import trace

from tidal.common.errors import InvalidArgument
from tidal.inference.config import RequestLimits
from tidal.inference.engine import Completion, Engine, TokenScores
from tidal.inference.occupancy import occupancy_reports, watch_intervals
from tidal.inference.request_checks import (
    DEFAULT_LIMITS,
    check_against_model,
    check_prompt_count,
    check_prompt_text,
    check_sampling,
    check_score,
)
from tidal.inference.sampling import SamplingParams
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import inference_pb2 as pb
from tidal.rpc.v1 import inference_pb2_grpc as pb_grpc
from tidal.text.agreement import tokenizer_info
from tidal.text.tokenizer import Tokenizer

_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    None: pb.FINISH_REASON_UNSPECIFIED,  # a streamed piece that is not the last
}


def _grpc_name(field: str) -> str:
    return f"sampling.{field}"


_THREAD_TOKENIZE_CHARS = 16 * 1024  # longer text prompts are tokenized off the event loop


def sampling_from_proto(
    s: pb.SamplingParams,
    *,
    eos_ids: Sequence[int] = (),
    limits: RequestLimits = DEFAULT_LIMITS,
) -> SamplingParams:
    """Domain sampling parameters, checked by `request_checks.check_sampling` (the checks the
    OpenAI endpoint runs too); checks that need the model come later (`check_against_model`).

    `eos_ids` are added to the stop tokens unless the request sets `ignore_eos`."""
    if len(s.stop_token_ids) > limits.max_stop_token_ids:  # before the list is built
        raise InvalidArgument(
            _grpc_name("stop_token_ids"),
            f"{len(s.stop_token_ids)} ids, the limit is {limits.max_stop_token_ids} "
            "(inference.limits.max_stop_token_ids)",
        )
    params = SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p if s.HasField("top_p") else 1.0,
        top_k=s.top_k,
        n=s.n if s.HasField("n") else 1,
        seed=s.seed if s.HasField("seed") else None,
        stop_token_ids=tuple(
            dict.fromkeys([*s.stop_token_ids, *(() if s.ignore_eos else eos_ids)])
        ),
        min_p=s.min_p,
        stop=tuple(s.stop),
        model_logprobs=s.return_model_logprobs,
    )
    check_sampling(params, _grpc_name, limits)
    return params


def completion_to_proto(c: Completion) -> pb.GenerateResponse:
    # Completion's fields are GenerateResponse's (less prompt scores, which only the HTTP
    # endpoint returns); only the finish reason is an enum there.
    fields = {k: v for k, v in vars(c).items() if k != "prompt_scores"}
    return pb.GenerateResponse(**{**fields, "finish_reason": _FINISH[c.finish_reason]})


def scores_to_proto(s: TokenScores) -> pb.ScoreResponse:
    return pb.ScoreResponse(
        start=s.start,
        logprobs=s.logprobs,
        ranks=s.ranks,
        top_ids=[t for row in s.top_ids for t in row],
        top_logprobs=[lp for row in s.top_logprobs for lp in row],
        policy_versions=s.policy_versions,
    )


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        *,
        replica_id: str,
        limits: RequestLimits = DEFAULT_LIMITS,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.replica_id = replica_id
        self.limits = limits
        self._closing = asyncio.Event()
        """Set when the server shuts down: WatchOccupancy streams end then."""

    def end_streams(self) -> None:
        """End every WatchOccupancy stream (the server is shutting down)."""
        self._closing.set()

    async def _prompt(self, request: pb.GenerateRequest) -> tuple[list[int], str]:
        """Prompt token ids, and the field they came from. Sizes before tokenizing."""
        if request.prompt_ids and request.prompt:
            raise InvalidArgument("prompt_ids", "exactly one of prompt_ids and prompt must be set")
        if request.prompt:
            check_prompt_text(request.prompt, "prompt", self.limits)
            encode = self.tokenizer.encode
            if len(request.prompt) <= _THREAD_TOKENIZE_CHARS:
                return encode(request.prompt, add_special_tokens=True), "prompt"
            ids = await asyncio.to_thread(encode, request.prompt, add_special_tokens=True)
            return ids, "prompt"
        if not request.prompt_ids:
            raise InvalidArgument("prompt_ids", "the prompt is empty; set prompt_ids or prompt")
        check_prompt_count(len(request.prompt_ids), "prompt_ids", self.limits)
        return list(request.prompt_ids), "prompt_ids"

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        # Sampling first: its checks are all cheap; the prompt may need tokenizing.
        params = sampling_from_proto(
            request.sampling, eos_ids=self.tokenizer.eos_ids, limits=self.limits
        )
        prompt_ids, field = await self._prompt(request)
        check_against_model(
            self.engine.status(), prompt_ids, params, prompt_field=field, names=_grpc_name
        )
        trace.get_current_span().set_attributes(
            {"prompt.tokens": len(prompt_ids), "sampling.n": params.n}
        )
        async for completion in self.engine.generate(prompt_ids, params, stream=request.stream):
            yield completion_to_proto(completion)

    async def Score(
        self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScoreResponse:
        check_prompt_count(len(request.token_ids), "token_ids", self.limits)
        start = request.start if request.HasField("start") else 1
        token_ids = list(request.token_ids)
        check_score(
            self.engine.status(), token_ids, start=start, top_k=request.top_k,
            names=str, limits=self.limits,
        )  # fmt: skip
        trace.get_current_span().set_attributes(
            {"score.tokens": len(token_ids), "score.start": start}
        )
        scores = await self.engine.score(token_ids, start=start, top_k=request.top_k)
        return scores_to_proto(scores)

    async def GetStatus(
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.InferenceStatus:
        # EngineStatus's fields are InferenceStatus's, less what the servicer knows.
        return pb.InferenceStatus(
            **dataclasses.asdict(self.engine.status()),
            replica_id=self.replica_id,
            tokenizer=tokenizer_info(self.tokenizer),
        )

    async def WatchOccupancy(
        self, request: pb.WatchOccupancyRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Occupancy]:
        min_interval_s, heartbeat_s = watch_intervals(request.min_interval_ms, request.heartbeat_ms)
        reports = occupancy_reports(
            self.engine.status,
            min_interval_s=min_interval_s,
            heartbeat_s=heartbeat_s,
            closing=self._closing,
        )
        sequence = 0
        async for figures in reports:
            sequence += 1
            yield pb.Occupancy(
                **dataclasses.asdict(figures), replica_id=self.replica_id, sequence=sequence
            )
