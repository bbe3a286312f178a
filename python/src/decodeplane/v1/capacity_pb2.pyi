from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from decodeplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CapacityUpdate(_message.Message):
    __slots__ = ["address", "at", "draining", "fingerprint", "incarnation", "readiness", "ready", "sequence", "shards"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    READINESS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    address: str
    at: _timestamp_pb2.Timestamp
    draining: bool
    fingerprint: _common_pb2.Fingerprint
    incarnation: int
    readiness: str
    ready: bool
    sequence: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardCapacity]
    def __init__(self, incarnation: _Optional[int] = ..., address: _Optional[str] = ..., ready: bool = ..., readiness: _Optional[str] = ..., draining: bool = ..., shards: _Optional[_Iterable[_Union[ShardCapacity, _Mapping]]] = ..., at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., sequence: _Optional[int] = ..., fingerprint: _Optional[_Union[_common_pb2.Fingerprint, _Mapping]] = ...) -> None: ...

class ReportCapacityRequest(_message.Message):
    __slots__ = ["decode_dp_rank", "metadata_slots_free", "pages_free", "queue_depth", "req_slots_free", "running", "state_slots_free", "tokens_free"]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    METADATA_SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FREE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    REQ_SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    STATE_SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FREE_FIELD_NUMBER: _ClassVar[int]
    decode_dp_rank: int
    metadata_slots_free: int
    pages_free: int
    queue_depth: int
    req_slots_free: int
    running: int
    state_slots_free: int
    tokens_free: int
    def __init__(self, decode_dp_rank: _Optional[int] = ..., tokens_free: _Optional[int] = ..., pages_free: _Optional[int] = ..., req_slots_free: _Optional[int] = ..., metadata_slots_free: _Optional[int] = ..., state_slots_free: _Optional[int] = ..., queue_depth: _Optional[int] = ..., running: _Optional[int] = ...) -> None: ...

class ReportCapacityResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ShardCapacity(_message.Message):
    __slots__ = ["blocked_by", "dp_rank", "draining_pages", "page_size", "pages_free", "pages_total", "queue_depth", "req_slots_free", "req_slots_total", "reserved_decode_tokens", "running", "tokens_free", "tokens_total"]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DRAINING_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGES_FREE_FIELD_NUMBER: _ClassVar[int]
    PAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    REQ_SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    REQ_SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESERVED_DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FREE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    blocked_by: str
    dp_rank: int
    draining_pages: int
    page_size: int
    pages_free: int
    pages_total: int
    queue_depth: int
    req_slots_free: int
    req_slots_total: int
    reserved_decode_tokens: int
    running: int
    tokens_free: int
    tokens_total: int
    def __init__(self, dp_rank: _Optional[int] = ..., page_size: _Optional[int] = ..., tokens_total: _Optional[int] = ..., tokens_free: _Optional[int] = ..., pages_total: _Optional[int] = ..., pages_free: _Optional[int] = ..., req_slots_total: _Optional[int] = ..., req_slots_free: _Optional[int] = ..., queue_depth: _Optional[int] = ..., blocked_by: _Optional[str] = ..., draining_pages: _Optional[int] = ..., running: _Optional[int] = ..., reserved_decode_tokens: _Optional[int] = ...) -> None: ...

class WatchCapacityRequest(_message.Message):
    __slots__ = ["keepalive_interval", "min_interval"]
    KEEPALIVE_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MIN_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    keepalive_interval: _duration_pb2.Duration
    min_interval: _duration_pb2.Duration
    def __init__(self, min_interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., keepalive_interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...
