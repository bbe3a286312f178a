from google.protobuf import duration_pb2 as _duration_pb2
from decodeplane.v1 import common_pb2 as _common_pb2
from decodeplane.v1 import rooms_pb2 as _rooms_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillClaimed(_message.Message):
    __slots__ = ["room"]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    room: int
    def __init__(self, room: _Optional[int] = ...) -> None: ...

class PrefillError(_message.Message):
    __slots__ = ["code", "message", "metadata", "reason"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    metadata: _containers.ScalarMap[str, str]
    reason: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PrefillEvent(_message.Message):
    __slots__ = ["more", "pong", "result", "room", "welcome"]
    MORE_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    more: _containers.RepeatedCompositeFieldContainer[PrefillEvent]
    pong: PrefillPong
    result: PrefillResult
    room: PrefillRoomEvent
    welcome: PrefillWelcome
    def __init__(self, welcome: _Optional[_Union[PrefillWelcome, _Mapping]] = ..., pong: _Optional[_Union[PrefillPong, _Mapping]] = ..., result: _Optional[_Union[PrefillResult, _Mapping]] = ..., room: _Optional[_Union[PrefillRoomEvent, _Mapping]] = ..., more: _Optional[_Iterable[_Union[PrefillEvent, _Mapping]]] = ...) -> None: ...

class PrefillHello(_message.Message):
    __slots__ = ["incarnation", "instance_id", "offers", "rank"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    instance_id: str
    offers: bool
    rank: _common_pb2.PrefillRank
    def __init__(self, rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., instance_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., offers: bool = ...) -> None: ...

class PrefillPing(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PrefillPong(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ["ack", "chunk", "claim", "hello", "more", "ping", "report", "seq", "traceparent", "tracestate"]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    ack: _rooms_pb2.AckRoomEndRequest
    chunk: _rooms_pb2.TransferRequest
    claim: _rooms_pb2.AwaitDestinationRequest
    hello: PrefillHello
    more: _containers.RepeatedCompositeFieldContainer[PrefillRequest]
    ping: PrefillPing
    report: _rooms_pb2.ReportTransferRequest
    seq: int
    traceparent: str
    tracestate: str
    def __init__(self, seq: _Optional[int] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ..., hello: _Optional[_Union[PrefillHello, _Mapping]] = ..., ping: _Optional[_Union[PrefillPing, _Mapping]] = ..., claim: _Optional[_Union[_rooms_pb2.AwaitDestinationRequest, _Mapping]] = ..., chunk: _Optional[_Union[_rooms_pb2.TransferRequest, _Mapping]] = ..., report: _Optional[_Union[_rooms_pb2.ReportTransferRequest, _Mapping]] = ..., ack: _Optional[_Union[_rooms_pb2.AckRoomEndRequest, _Mapping]] = ..., more: _Optional[_Iterable[_Union[PrefillRequest, _Mapping]]] = ...) -> None: ...

class PrefillResult(_message.Message):
    __slots__ = ["ack", "chunk", "claim", "error", "report", "seq"]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ack: _rooms_pb2.AckRoomEndResponse
    chunk: _rooms_pb2.TransferResponse
    claim: PrefillClaimed
    error: PrefillError
    report: _rooms_pb2.ReportTransferResponse
    seq: int
    def __init__(self, seq: _Optional[int] = ..., error: _Optional[_Union[PrefillError, _Mapping]] = ..., claim: _Optional[_Union[PrefillClaimed, _Mapping]] = ..., chunk: _Optional[_Union[_rooms_pb2.TransferResponse, _Mapping]] = ..., report: _Optional[_Union[_rooms_pb2.ReportTransferResponse, _Mapping]] = ..., ack: _Optional[_Union[_rooms_pb2.AckRoomEndResponse, _Mapping]] = ...) -> None: ...

class PrefillRoomEvent(_message.Message):
    __slots__ = ["claim_seq", "event", "offer", "room"]
    CLAIM_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    OFFER_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    claim_seq: int
    event: _rooms_pb2.DestinationEvent
    offer: bool
    room: int
    def __init__(self, room: _Optional[int] = ..., claim_seq: _Optional[int] = ..., event: _Optional[_Union[_rooms_pb2.DestinationEvent, _Mapping]] = ..., offer: bool = ...) -> None: ...

class PrefillWelcome(_message.Message):
    __slots__ = ["heartbeat_interval", "heartbeat_max_failures", "incarnation", "max_queued", "offers"]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MAX_FAILURES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_FIELD_NUMBER: _ClassVar[int]
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: _duration_pb2.Duration
    heartbeat_max_failures: int
    incarnation: int
    max_queued: int
    offers: bool
    def __init__(self, incarnation: _Optional[int] = ..., heartbeat_interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., heartbeat_max_failures: _Optional[int] = ..., max_queued: _Optional[int] = ..., offers: bool = ...) -> None: ...
