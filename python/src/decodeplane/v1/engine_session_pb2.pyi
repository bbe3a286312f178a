from google.protobuf import duration_pb2 as _duration_pb2
from decodeplane.v1 import capacity_pb2 as _capacity_pb2
from decodeplane.v1 import rooms_pb2 as _rooms_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ENGINE_EVENTS_ALL: EngineEvents
ENGINE_EVENTS_OUTCOME: EngineEvents

class EngineEvent(_message.Message):
    __slots__ = ["more", "reply", "room"]
    MORE_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    more: _containers.RepeatedCompositeFieldContainer[EngineEvent]
    reply: EngineReply
    room: EngineRoomEvent
    def __init__(self, reply: _Optional[_Union[EngineReply, _Mapping]] = ..., room: _Optional[_Union[EngineRoomEvent, _Mapping]] = ..., more: _Optional[_Iterable[_Union[EngineEvent, _Mapping]]] = ...) -> None: ...

class EngineOpen(_message.Message):
    __slots__ = ["events", "rooms", "traceparents"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENTS_FIELD_NUMBER: _ClassVar[int]
    events: EngineEvents
    rooms: _containers.RepeatedCompositeFieldContainer[_rooms_pb2.OpenRoomRequest]
    traceparents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rooms: _Optional[_Iterable[_Union[_rooms_pb2.OpenRoomRequest, _Mapping]]] = ..., traceparents: _Optional[_Iterable[str]] = ..., events: _Optional[_Union[EngineEvents, str]] = ...) -> None: ...

class EngineReply(_message.Message):
    __slots__ = ["code", "incarnation", "message", "results", "seq"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    code: int
    incarnation: int
    message: str
    results: _containers.RepeatedCompositeFieldContainer[EngineResult]
    seq: int
    def __init__(self, seq: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., results: _Optional[_Iterable[_Union[EngineResult, _Mapping]]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class EngineRequest(_message.Message):
    __slots__ = ["abort", "capacity", "declare", "more", "open", "release", "seq", "traceparent", "watch"]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DECLARE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    abort: _rooms_pb2.AbortRoomRequest
    capacity: _capacity_pb2.ReportCapacityRequest
    declare: _rooms_pb2.DeclareDestinationRequest
    more: _containers.RepeatedCompositeFieldContainer[EngineRequest]
    open: EngineOpen
    release: _rooms_pb2.ReleaseRoomRequest
    seq: int
    traceparent: str
    watch: EngineWatch
    def __init__(self, seq: _Optional[int] = ..., open: _Optional[_Union[EngineOpen, _Mapping]] = ..., release: _Optional[_Union[_rooms_pb2.ReleaseRoomRequest, _Mapping]] = ..., abort: _Optional[_Union[_rooms_pb2.AbortRoomRequest, _Mapping]] = ..., watch: _Optional[_Union[EngineWatch, _Mapping]] = ..., declare: _Optional[_Union[_rooms_pb2.DeclareDestinationRequest, _Mapping]] = ..., capacity: _Optional[_Union[_capacity_pb2.ReportCapacityRequest, _Mapping]] = ..., traceparent: _Optional[str] = ..., more: _Optional[_Iterable[_Union[EngineRequest, _Mapping]]] = ...) -> None: ...

class EngineResult(_message.Message):
    __slots__ = ["abort", "capacity", "code", "declare", "message", "metadata", "open", "reason", "release", "retry_after", "room"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ABORT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DECLARE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    abort: _rooms_pb2.AbortRoomResponse
    capacity: _capacity_pb2.ReportCapacityResponse
    code: int
    declare: _rooms_pb2.DeclareDestinationResponse
    message: str
    metadata: _containers.ScalarMap[str, str]
    open: _rooms_pb2.OpenRoomResponse
    reason: str
    release: _rooms_pb2.ReleaseRoomResponse
    retry_after: _duration_pb2.Duration
    room: int
    def __init__(self, room: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., open: _Optional[_Union[_rooms_pb2.OpenRoomResponse, _Mapping]] = ..., release: _Optional[_Union[_rooms_pb2.ReleaseRoomResponse, _Mapping]] = ..., abort: _Optional[_Union[_rooms_pb2.AbortRoomResponse, _Mapping]] = ..., declare: _Optional[_Union[_rooms_pb2.DeclareDestinationResponse, _Mapping]] = ..., capacity: _Optional[_Union[_capacity_pb2.ReportCapacityResponse, _Mapping]] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EngineRoomEvent(_message.Message):
    __slots__ = ["event", "room", "seq"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    event: _rooms_pb2.RoomEvent
    room: int
    seq: int
    def __init__(self, room: _Optional[int] = ..., seq: _Optional[int] = ..., event: _Optional[_Union[_rooms_pb2.RoomEvent, _Mapping]] = ...) -> None: ...

class EngineWatch(_message.Message):
    __slots__ = ["events", "rooms"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    events: EngineEvents
    rooms: _containers.RepeatedCompositeFieldContainer[EngineWatchRoom]
    def __init__(self, rooms: _Optional[_Iterable[_Union[EngineWatchRoom, _Mapping]]] = ..., events: _Optional[_Union[EngineEvents, str]] = ...) -> None: ...

class EngineWatchRoom(_message.Message):
    __slots__ = ["after", "room"]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    after: int
    room: int
    def __init__(self, room: _Optional[int] = ..., after: _Optional[int] = ...) -> None: ...

class EngineEvents(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
