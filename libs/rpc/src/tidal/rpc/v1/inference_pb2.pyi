from tidal.rpc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class WatchOccupancyRequest(_message.Message):
    __slots__ = ("min_interval_ms", "heartbeat_ms")
    MIN_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    min_interval_ms: int
    heartbeat_ms: int
    def __init__(self, min_interval_ms: _Optional[int] = ..., heartbeat_ms: _Optional[int] = ...) -> None: ...

class Occupancy(_message.Message):
    __slots__ = ("replica_id", "queued", "running", "kv_slots_used", "kv_slots_total", "kv_usage", "sequence")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_SLOTS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    queued: int
    running: int
    kv_slots_used: int
    kv_slots_total: int
    kv_usage: float
    sequence: int
    def __init__(self, replica_id: _Optional[str] = ..., queued: _Optional[int] = ..., running: _Optional[int] = ..., kv_slots_used: _Optional[int] = ..., kv_slots_total: _Optional[int] = ..., kv_usage: _Optional[float] = ..., sequence: _Optional[int] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "start", "top_k")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    start: int
    top_k: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., start: _Optional[int] = ..., top_k: _Optional[int] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("start", "logprobs", "ranks", "top_ids", "top_logprobs", "policy_versions")
    START_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    start: int
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, start: _Optional[int] = ..., logprobs: _Optional[_Iterable[float]] = ..., ranks: _Optional[_Iterable[int]] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ..., policy_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "n", "seed", "stop_token_ids", "min_p", "stop", "return_model_logprobs", "ignore_eos")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    RETURN_MODEL_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    n: int
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    min_p: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    return_model_logprobs: bool
    ignore_eos: bool
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., n: _Optional[int] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., min_p: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., return_model_logprobs: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_ids", "prompt", "sampling", "stream")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt: str
    sampling: SamplingParams
    stream: bool
    def __init__(self, request_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., prompt: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., stream: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("index", "prompt_ids", "token_ids", "logprobs", "policy_versions", "finish_reason", "text", "model_logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    text: str
    model_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, index: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., policy_versions: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., text: _Optional[str] = ..., model_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class InferenceStatus(_message.Message):
    __slots__ = ("policy_version", "running", "queued", "generated_tokens", "tokens_per_s", "model", "vocab_size", "max_seq_len", "replica_id", "kv_slots_used", "kv_slots_total", "kv_usage", "kernels", "load_error", "tokenizer")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    KV_SLOTS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    LOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    running: int
    queued: int
    generated_tokens: int
    tokens_per_s: float
    model: str
    vocab_size: int
    max_seq_len: int
    replica_id: str
    kv_slots_used: int
    kv_slots_total: int
    kv_usage: float
    kernels: str
    load_error: str
    tokenizer: _common_pb2.TokenizerInfo
    def __init__(self, policy_version: _Optional[int] = ..., running: _Optional[int] = ..., queued: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_seq_len: _Optional[int] = ..., replica_id: _Optional[str] = ..., kv_slots_used: _Optional[int] = ..., kv_slots_total: _Optional[int] = ..., kv_usage: _Optional[float] = ..., kernels: _Optional[str] = ..., load_error: _Optional[str] = ..., tokenizer: _Optional[_Union[_common_pb2.TokenizerInfo, _Mapping]] = ...) -> None: ...
