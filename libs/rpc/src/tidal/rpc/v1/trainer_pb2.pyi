from tidal.rpc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LossKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOSS_KIND_UNSPECIFIED: _ClassVar[LossKind]
    LOSS_KIND_POLICY_GRADIENT: _ClassVar[LossKind]
    LOSS_KIND_SFT: _ClassVar[LossKind]
LOSS_KIND_UNSPECIFIED: LossKind
LOSS_KIND_POLICY_GRADIENT: LossKind
LOSS_KIND_SFT: LossKind

class MicroBatch(_message.Message):
    __slots__ = ("input_ids", "position_ids", "sample_lengths", "loss_mask", "advantages", "behaviour_logprobs", "rank", "policy_versions", "sample_parents")
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    POSITION_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_PARENTS_FIELD_NUMBER: _ClassVar[int]
    input_ids: _common_pb2.Tensor
    position_ids: _common_pb2.Tensor
    sample_lengths: _common_pb2.Tensor
    loss_mask: _common_pb2.Tensor
    advantages: _common_pb2.Tensor
    behaviour_logprobs: _common_pb2.Tensor
    rank: int
    policy_versions: _common_pb2.Tensor
    sample_parents: _common_pb2.Tensor
    def __init__(self, input_ids: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., position_ids: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., sample_lengths: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., loss_mask: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., advantages: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., behaviour_logprobs: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., rank: _Optional[int] = ..., policy_versions: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., sample_parents: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("step", "micro_batches", "loss", "payload_sha256")
    STEP_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA256_FIELD_NUMBER: _ClassVar[int]
    step: int
    micro_batches: _containers.RepeatedCompositeFieldContainer[MicroBatch]
    loss: LossKind
    payload_sha256: bytes
    def __init__(self, step: _Optional[int] = ..., micro_batches: _Optional[_Iterable[_Union[MicroBatch, _Mapping]]] = ..., loss: _Optional[_Union[LossKind, str]] = ..., payload_sha256: _Optional[bytes] = ...) -> None: ...

class TrainChunk(_message.Message):
    __slots__ = ("total_bytes", "offset", "data")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    offset: int
    data: bytes
    def __init__(self, total_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TrainResponse(_message.Message):
    __slots__ = ("step", "policy_version", "metrics", "duplicate")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    metrics: _containers.ScalarMap[str, float]
    duplicate: bool
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class TrainerStatus(_message.Message):
    __slots__ = ("step", "policy_version", "steps_trained", "duplicates_answered", "num_parameters", "model", "device", "data_parallel_ranks", "tokenizer", "write_error", "write_error_disk_full")
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEPS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DATA_PARALLEL_RANKS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    WRITE_ERROR_FIELD_NUMBER: _ClassVar[int]
    WRITE_ERROR_DISK_FULL_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    steps_trained: int
    duplicates_answered: int
    num_parameters: int
    model: str
    device: str
    data_parallel_ranks: int
    tokenizer: _common_pb2.TokenizerInfo
    write_error: str
    write_error_disk_full: bool
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., steps_trained: _Optional[int] = ..., duplicates_answered: _Optional[int] = ..., num_parameters: _Optional[int] = ..., model: _Optional[str] = ..., device: _Optional[str] = ..., data_parallel_ranks: _Optional[int] = ..., tokenizer: _Optional[_Union[_common_pb2.TokenizerInfo, _Mapping]] = ..., write_error: _Optional[str] = ..., write_error_disk_full: _Optional[bool] = ...) -> None: ...
