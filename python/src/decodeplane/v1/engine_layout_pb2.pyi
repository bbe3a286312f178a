from decodeplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EngineAuxBuffer(_message.Message):
    __slots__ = ["length", "memory", "name", "row_len"]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROW_LEN_FIELD_NUMBER: _ClassVar[int]
    length: int
    memory: EngineMemory
    name: str
    row_len: int
    def __init__(self, name: _Optional[str] = ..., row_len: _Optional[int] = ..., length: _Optional[int] = ..., memory: _Optional[_Union[EngineMemory, _Mapping]] = ...) -> None: ...

class EngineCudaIpc(_message.Message):
    __slots__ = ["device", "handle"]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    device: int
    handle: bytes
    def __init__(self, handle: _Optional[bytes] = ..., device: _Optional[int] = ...) -> None: ...

class EngineKVBuffer(_message.Message):
    __slots__ = ["draft", "item_len", "layer", "length", "memory", "name", "value"]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    ITEM_LEN_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    draft: bool
    item_len: int
    layer: int
    length: int
    memory: EngineMemory
    name: str
    value: bool
    def __init__(self, name: _Optional[str] = ..., layer: _Optional[int] = ..., value: bool = ..., draft: bool = ..., item_len: _Optional[int] = ..., length: _Optional[int] = ..., memory: _Optional[_Union[EngineMemory, _Mapping]] = ...) -> None: ...

class EngineLayout(_message.Message):
    __slots__ = ["aux", "kv", "marker", "state"]
    AUX_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    MARKER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    aux: _containers.RepeatedCompositeFieldContainer[EngineAuxBuffer]
    kv: _containers.RepeatedCompositeFieldContainer[EngineKVBuffer]
    marker: str
    state: _containers.RepeatedCompositeFieldContainer[EngineStateBuffer]
    def __init__(self, kv: _Optional[_Iterable[_Union[EngineKVBuffer, _Mapping]]] = ..., aux: _Optional[_Iterable[_Union[EngineAuxBuffer, _Mapping]]] = ..., marker: _Optional[str] = ..., state: _Optional[_Iterable[_Union[EngineStateBuffer, _Mapping]]] = ...) -> None: ...

class EngineMemory(_message.Message):
    __slots__ = ["cuda_ipc", "nixl", "shared"]
    CUDA_IPC_FIELD_NUMBER: _ClassVar[int]
    NIXL_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    cuda_ipc: EngineCudaIpc
    nixl: EngineNixl
    shared: EngineSharedMemory
    def __init__(self, shared: _Optional[_Union[EngineSharedMemory, _Mapping]] = ..., cuda_ipc: _Optional[_Union[EngineCudaIpc, _Mapping]] = ..., nixl: _Optional[_Union[EngineNixl, _Mapping]] = ...) -> None: ...

class EngineNixl(_message.Message):
    __slots__ = ["serialized"]
    SERIALIZED_FIELD_NUMBER: _ClassVar[int]
    serialized: bytes
    def __init__(self, serialized: _Optional[bytes] = ...) -> None: ...

class EngineSharedMemory(_message.Message):
    __slots__ = ["offset", "path"]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    path: str
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class EngineStateBuffer(_message.Message):
    __slots__ = ["item_len", "length", "memory", "name", "type"]
    ITEM_LEN_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    item_len: int
    length: int
    memory: EngineMemory
    name: str
    type: _common_pb2.StateType
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[_common_pb2.StateType, str]] = ..., item_len: _Optional[int] = ..., length: _Optional[int] = ..., memory: _Optional[_Union[EngineMemory, _Mapping]] = ...) -> None: ...

class RegisterEngineLayoutRequest(_message.Message):
    __slots__ = ["decode_dp_rank", "decode_tp_rank", "layout"]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    decode_dp_rank: int
    decode_tp_rank: int
    layout: EngineLayout
    def __init__(self, decode_dp_rank: _Optional[int] = ..., decode_tp_rank: _Optional[int] = ..., layout: _Optional[_Union[EngineLayout, _Mapping]] = ...) -> None: ...

class RegisterEngineLayoutResponse(_message.Message):
    __slots__ = ["already", "layout_id"]
    ALREADY_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_ID_FIELD_NUMBER: _ClassVar[int]
    already: bool
    layout_id: int
    def __init__(self, layout_id: _Optional[int] = ..., already: bool = ...) -> None: ...

class RegisteredEngineLayout(_message.Message):
    __slots__ = ["decode_dp_rank", "decode_tp_rank", "dropped", "layout", "layout_id"]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_ID_FIELD_NUMBER: _ClassVar[int]
    decode_dp_rank: int
    decode_tp_rank: int
    dropped: str
    layout: EngineLayout
    layout_id: int
    def __init__(self, decode_dp_rank: _Optional[int] = ..., decode_tp_rank: _Optional[int] = ..., layout_id: _Optional[int] = ..., layout: _Optional[_Union[EngineLayout, _Mapping]] = ..., dropped: _Optional[str] = ...) -> None: ...
