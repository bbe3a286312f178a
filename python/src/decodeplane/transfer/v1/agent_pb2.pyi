from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

BUFFER_KIND_KV_POOL: BufferKind
BUFFER_KIND_METADATA: BufferKind
BUFFER_KIND_PREFILL_KV: BufferKind
BUFFER_KIND_STAGING_RING: BufferKind
BUFFER_KIND_UNSPECIFIED: BufferKind
DESCRIPTOR: _descriptor.FileDescriptor

class AgentMemory(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Buffer(_message.Message):
    __slots__ = ["address", "item_size", "kind", "length", "memory", "name"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ITEM_SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    address: int
    item_size: int
    kind: BufferKind
    length: int
    memory: BufferMemory
    name: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[BufferKind, str]] = ..., address: _Optional[int] = ..., length: _Optional[int] = ..., item_size: _Optional[int] = ..., memory: _Optional[_Union[BufferMemory, _Mapping]] = ...) -> None: ...

class BufferMemory(_message.Message):
    __slots__ = ["agent", "cuda_ipc", "nixl", "shared"]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_FIELD_NUMBER: _ClassVar[int]
    NIXL_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    agent: AgentMemory
    cuda_ipc: CudaIpc
    nixl: NixlDescriptor
    shared: SharedMemory
    def __init__(self, agent: _Optional[_Union[AgentMemory, _Mapping]] = ..., shared: _Optional[_Union[SharedMemory, _Mapping]] = ..., cuda_ipc: _Optional[_Union[CudaIpc, _Mapping]] = ..., nixl: _Optional[_Union[NixlDescriptor, _Mapping]] = ...) -> None: ...

class CancelRoomRequest(_message.Message):
    __slots__ = ["batch_ids", "room"]
    BATCH_IDS_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    batch_ids: _containers.RepeatedScalarFieldContainer[str]
    room: int
    def __init__(self, room: _Optional[int] = ..., batch_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelRoomResponse(_message.Message):
    __slots__ = ["cancelled"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ["agent_instance", "batch_id", "bytes", "error", "ok", "room"]
    AGENT_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    agent_instance: str
    batch_id: str
    bytes: int
    error: str
    ok: bool
    room: int
    def __init__(self, batch_id: _Optional[str] = ..., room: _Optional[int] = ..., ok: bool = ..., error: _Optional[str] = ..., bytes: _Optional[int] = ..., agent_instance: _Optional[str] = ...) -> None: ...

class Copy(_message.Message):
    __slots__ = ["count", "dst_buffer", "dst_offset", "dst_stride", "length", "src_buffer", "src_offset", "src_stride"]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DST_BUFFER_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DST_STRIDE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SRC_BUFFER_FIELD_NUMBER: _ClassVar[int]
    SRC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SRC_STRIDE_FIELD_NUMBER: _ClassVar[int]
    count: int
    dst_buffer: str
    dst_offset: int
    dst_stride: int
    length: int
    src_buffer: str
    src_offset: int
    src_stride: int
    def __init__(self, src_buffer: _Optional[str] = ..., src_offset: _Optional[int] = ..., dst_buffer: _Optional[str] = ..., dst_offset: _Optional[int] = ..., length: _Optional[int] = ..., count: _Optional[int] = ..., src_stride: _Optional[int] = ..., dst_stride: _Optional[int] = ...) -> None: ...

class CudaIpc(_message.Message):
    __slots__ = ["device", "handle"]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    device: int
    handle: bytes
    def __init__(self, handle: _Optional[bytes] = ..., device: _Optional[int] = ...) -> None: ...

class DeregisterBuffersRequest(_message.Message):
    __slots__ = ["names"]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class DeregisterBuffersResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class InlineWrite(_message.Message):
    __slots__ = ["data", "dst_buffer", "dst_offset"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DST_BUFFER_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    dst_buffer: str
    dst_offset: int
    def __init__(self, dst_buffer: _Optional[str] = ..., dst_offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class NixlDescriptor(_message.Message):
    __slots__ = ["serialized"]
    SERIALIZED_FIELD_NUMBER: _ClassVar[int]
    serialized: bytes
    def __init__(self, serialized: _Optional[bytes] = ...) -> None: ...

class ReadBufferRequest(_message.Message):
    __slots__ = ["length", "name", "offset"]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    length: int
    name: str
    offset: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReadBufferResponse(_message.Message):
    __slots__ = ["data"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class RegisterBuffersRequest(_message.Message):
    __slots__ = ["buffers"]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    buffers: _containers.RepeatedCompositeFieldContainer[Buffer]
    def __init__(self, buffers: _Optional[_Iterable[_Union[Buffer, _Mapping]]] = ...) -> None: ...

class RegisterBuffersResponse(_message.Message):
    __slots__ = ["agent_instance", "buffers"]
    AGENT_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    agent_instance: str
    buffers: _containers.RepeatedCompositeFieldContainer[Buffer]
    def __init__(self, buffers: _Optional[_Iterable[_Union[Buffer, _Mapping]]] = ..., agent_instance: _Optional[str] = ...) -> None: ...

class SharedMemory(_message.Message):
    __slots__ = ["offset", "path"]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    path: str
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ["batch_id", "copies", "deadline", "room", "writes"]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    copies: _containers.RepeatedCompositeFieldContainer[Copy]
    deadline: _timestamp_pb2.Timestamp
    room: int
    writes: _containers.RepeatedCompositeFieldContainer[InlineWrite]
    def __init__(self, batch_id: _Optional[str] = ..., room: _Optional[int] = ..., copies: _Optional[_Iterable[_Union[Copy, _Mapping]]] = ..., writes: _Optional[_Iterable[_Union[InlineWrite, _Mapping]]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ["agent_instance", "duplicate"]
    AGENT_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    agent_instance: str
    duplicate: bool
    def __init__(self, duplicate: bool = ..., agent_instance: _Optional[str] = ...) -> None: ...

class WatchCompletionsRequest(_message.Message):
    __slots__ = ["replay_batch_ids"]
    REPLAY_BATCH_IDS_FIELD_NUMBER: _ClassVar[int]
    replay_batch_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replay_batch_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WriteBufferRequest(_message.Message):
    __slots__ = ["data", "name", "offset"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    name: str
    offset: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WriteBufferResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class BufferKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
