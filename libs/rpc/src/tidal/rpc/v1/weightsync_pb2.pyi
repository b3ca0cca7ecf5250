from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SyncRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SYNC_ROLE_UNSPECIFIED: _ClassVar[SyncRole]
    SYNC_ROLE_TRAINER: _ClassVar[SyncRole]
    SYNC_ROLE_REPLICA: _ClassVar[SyncRole]
SYNC_ROLE_UNSPECIFIED: SyncRole
SYNC_ROLE_TRAINER: SyncRole
SYNC_ROLE_REPLICA: SyncRole

class WeightFile(_message.Message):
    __slots__ = ("path", "size", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("version", "step", "format", "location", "files", "base_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    step: int
    format: str
    location: str
    files: _containers.RepeatedCompositeFieldContainer[WeightFile]
    base_version: int
    def __init__(self, version: _Optional[int] = ..., step: _Optional[int] = ..., format: _Optional[str] = ..., location: _Optional[str] = ..., files: _Optional[_Iterable[_Union[WeightFile, _Mapping]]] = ..., base_version: _Optional[int] = ...) -> None: ...

class WeightVersion(_message.Message):
    __slots__ = ("manifest", "loaded_by", "published_unix_ms", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    LOADED_BY_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    loaded_by: _containers.RepeatedScalarFieldContainer[str]
    published_unix_ms: int
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., loaded_by: _Optional[_Iterable[str]] = ..., published_unix_ms: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("manifest",)
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[WeightVersion]
    def __init__(self, versions: _Optional[_Iterable[_Union[WeightVersion, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("replica_id", "after_version", "loaded_version")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOADED_VERSION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    after_version: int
    loaded_version: int
    def __init__(self, replica_id: _Optional[str] = ..., after_version: _Optional[int] = ..., loaded_version: _Optional[int] = ...) -> None: ...

class WatchLoadedRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadedVersions(_message.Message):
    __slots__ = ("published", "replicas")
    class ReplicasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    published: int
    replicas: _containers.ScalarMap[str, int]
    def __init__(self, published: _Optional[int] = ..., replicas: _Optional[_Mapping[str, int]] = ...) -> None: ...

class BeginLoadRequest(_message.Message):
    __slots__ = ("replica_id", "version")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    version: int
    def __init__(self, replica_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class BeginLoadResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AckLoadedRequest(_message.Message):
    __slots__ = ("replica_id", "version")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    version: int
    def __init__(self, replica_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class AckLoadedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchWeightsRequest(_message.Message):
    __slots__ = ("version", "path", "offset")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    version: int
    path: str
    offset: int
    def __init__(self, version: _Optional[int] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("path", "offset", "data")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    data: bytes
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadWeightsRequest(_message.Message):
    __slots__ = ("manifest", "chunk")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    chunk: WeightChunk
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunk, _Mapping]] = ...) -> None: ...

class GetUploadProgressRequest(_message.Message):
    __slots__ = ("manifest",)
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ...) -> None: ...

class FileProgress(_message.Message):
    __slots__ = ("path", "received")
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    path: str
    received: int
    def __init__(self, path: _Optional[str] = ..., received: _Optional[int] = ...) -> None: ...

class UploadProgress(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileProgress]
    def __init__(self, files: _Optional[_Iterable[_Union[FileProgress, _Mapping]]] = ...) -> None: ...

class JoinSyncRequest(_message.Message):
    __slots__ = ("member_id", "role", "store_address", "after_generation")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AFTER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    role: SyncRole
    store_address: str
    after_generation: int
    def __init__(self, member_id: _Optional[str] = ..., role: _Optional[_Union[SyncRole, str]] = ..., store_address: _Optional[str] = ..., after_generation: _Optional[int] = ...) -> None: ...

class BroadcastGroup(_message.Message):
    __slots__ = ("member", "reason", "store_address", "rank", "world_size", "backend", "bucket_bytes", "timeout_s", "generation")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    member: bool
    reason: str
    store_address: str
    rank: int
    world_size: int
    backend: str
    bucket_bytes: int
    timeout_s: float
    generation: int
    def __init__(self, member: _Optional[bool] = ..., reason: _Optional[str] = ..., store_address: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[str] = ..., bucket_bytes: _Optional[int] = ..., timeout_s: _Optional[float] = ..., generation: _Optional[int] = ...) -> None: ...

class SyncPlan(_message.Message):
    __slots__ = ("transport", "chunk_bytes", "group")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    transport: str
    chunk_bytes: int
    group: BroadcastGroup
    def __init__(self, transport: _Optional[str] = ..., chunk_bytes: _Optional[int] = ..., group: _Optional[_Union[BroadcastGroup, _Mapping]] = ...) -> None: ...
