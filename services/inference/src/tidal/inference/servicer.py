"""InferenceService: proto ⇄ engine. Errors are raised; the interceptor maps them.

Validation happens here, before anything is queued, and names the offending field.
Checks that need the model (token ids within the vocabulary, prompt and max_tokens within
the context) run after the "no weights yet" check, because the model defines them.
A prompt plus max_tokens longer than the context is accepted: the completion ends at the
context ("length"), which lets a caller use one max_tokens for prompts of any length.
Cancellation needs no code here: when the client goes away grpc cancels this handler,
which closes the engine's generator, which marks the request cancelled.

Text and ids: a text prompt is encoded by the served tokenizer with
`add_special_tokens=True` (its own BOS, as Hugging Face does; none for Qwen); a chat
should be rendered by the caller (the orchestrator owns templates) and sent as ids,
which pass through untouched. A response's `text` is the engine's incremental decode of
its ids (special tokens skipped); streamed pieces concatenate to the full decode.

EOS: generation ends at the tokenizer's `eos_ids` (its EOS, generation_config.json's
`eos_token_id` list, the chat template's end of turn) unless the request sets
`ignore_eos`; they are appended to the request's `stop_token_ids`, so an EOS ends a
completion exactly like a listed stop token (kept, finish reason STOP). Stopping by
default is what a real model needs (vLLM's default too); a caller listing EOS ids
itself is harmless. `ignore_eos` is for benchmarks and tests of fixed length.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
from opentelemetry import trace

from tidal.common.errors import InvalidArgument, Unavailable
from tidal.inference.engine import Completion, Engine
from tidal.inference.sampling import SamplingParams
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import inference_pb2 as pb
from tidal.rpc.v1 import inference_pb2_grpc as pb_grpc
from tidal.text.agreement import tokenizer_info
from tidal.text.protocol import Tokenizer

_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    None: pb.FINISH_REASON_UNSPECIFIED,  # a streamed piece that is not the last
}


def sampling_from_proto(s: pb.SamplingParams, *, eos_ids: Sequence[int] = ()) -> SamplingParams:
    """Domain sampling parameters; checks that need no model (see `_check_against_model`).

    `eos_ids` are added to the stop tokens unless the request sets `ignore_eos`."""
    if s.max_tokens <= 0:
        raise InvalidArgument("sampling.max_tokens", f"must be > 0, got {s.max_tokens}")
    if s.HasField("n") and s.n <= 0:
        raise InvalidArgument("sampling.n", f"must be >= 1 (unset means 1), got {s.n}")
    if not s.temperature >= 0:  # also refuses NaN
        raise InvalidArgument("sampling.temperature", f"must be >= 0, got {s.temperature}")
    if s.HasField("top_p") and not 0 < s.top_p <= 1:
        raise InvalidArgument("sampling.top_p", f"must be in (0, 1] (unset means 1), got {s.top_p}")
    if s.top_k < 0:
        raise InvalidArgument("sampling.top_k", f"must be >= 0 (0 disables), got {s.top_k}")
    if not 0 <= s.min_p <= 1:
        raise InvalidArgument("sampling.min_p", f"must be in [0, 1] (0 disables), got {s.min_p}")
    for i, stop in enumerate(s.stop):
        if not stop:
            raise InvalidArgument(f"sampling.stop[{i}]", "a stop string must not be empty")
    return SamplingParams(
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


def completion_to_proto(c: Completion) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        index=c.index,
        prompt_ids=c.prompt_ids,
        token_ids=c.token_ids,
        logprobs=c.logprobs,
        policy_versions=c.policy_versions,
        finish_reason=_FINISH[c.finish_reason],
        text=c.text,
        model_logprobs=c.model_logprobs,
    )


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, engine: Engine, tokenizer: Tokenizer, *, replica_id: str) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.replica_id = replica_id

    def _prompt(self, request: pb.GenerateRequest) -> tuple[list[int], str]:
        """Prompt token ids, and the field they came from."""
        if request.prompt_ids and request.prompt:
            raise InvalidArgument("prompt_ids", "exactly one of prompt_ids and prompt must be set")
        if request.prompt:
            return self.tokenizer.encode(request.prompt, add_special_tokens=True), "prompt"
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
        if s.max_tokens > context:
            raise InvalidArgument(
                "sampling.max_tokens",
                f"{s.max_tokens} is above the model's context length (max_seq_len {context})",
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
        params = sampling_from_proto(request.sampling, eos_ids=self.tokenizer.eos_ids)
        self._check_against_model(prompt_ids, field, params)
        trace.get_current_span().set_attributes(
            {"prompt.tokens": len(prompt_ids), "sampling.n": params.n}
        )
        async for completion in self.engine.generate(prompt_ids, params, stream=request.stream):
            yield completion_to_proto(completion)

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
            kv_slots_used=s.kv_slots_used,
            kv_slots_total=s.kv_slots_total,
            kv_usage=s.kv_usage,
            kernels=s.kernels,
            load_error=s.load_error,
            tokenizer=tokenizer_info(self.tokenizer),
        )
