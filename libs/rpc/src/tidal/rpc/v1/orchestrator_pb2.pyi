from tidal.rpc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StepSummary(_message.Message):
    __slots__ = ("step", "phase", "reward_mean", "policy_version", "seconds")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    step: int
    phase: str
    reward_mean: float
    policy_version: int
    seconds: float
    def __init__(self, step: _Optional[int] = ..., phase: _Optional[str] = ..., reward_mean: _Optional[float] = ..., policy_version: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "total_steps", "policy_version", "state", "recent")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    policy_version: int
    state: str
    recent: _containers.RepeatedCompositeFieldContainer[StepSummary]
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., policy_version: _Optional[int] = ..., state: _Optional[str] = ..., recent: _Optional[_Iterable[_Union[StepSummary, _Mapping]]] = ...) -> None: ...
