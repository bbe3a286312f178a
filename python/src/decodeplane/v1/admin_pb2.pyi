from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from decodeplane.v1 import common_pb2 as _common_pb2
from decodeplane.v1 import engine_layout_pb2 as _engine_layout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConfigValue(_message.Message):
    __slots__ = ["key", "source", "value"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    source: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ["rooms_in_flight"]
    ROOMS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    rooms_in_flight: int
    def __init__(self, rooms_in_flight: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ["config", "draining", "engine_layouts", "incarnation", "layout", "pending_claims", "prefills", "readiness", "ready", "rooms_by_phase", "shards", "started_at", "transfer_path", "uptime", "version"]
    class RoomsByPhaseEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PENDING_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    PREFILLS_FIELD_NUMBER: _ClassVar[int]
    READINESS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ROOMS_BY_PHASE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_PATH_FIELD_NUMBER: _ClassVar[int]
    UPTIME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    config: _containers.RepeatedCompositeFieldContainer[ConfigValue]
    draining: bool
    engine_layouts: _containers.RepeatedCompositeFieldContainer[_engine_layout_pb2.RegisteredEngineLayout]
    incarnation: int
    layout: _common_pb2.KVLayout
    pending_claims: int
    prefills: _containers.RepeatedCompositeFieldContainer[PrefillStatus]
    readiness: str
    ready: bool
    rooms_by_phase: _containers.ScalarMap[str, int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    started_at: _timestamp_pb2.Timestamp
    transfer_path: str
    uptime: _duration_pb2.Duration
    version: str
    def __init__(self, version: _Optional[str] = ..., ready: bool = ..., readiness: _Optional[str] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., uptime: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., draining: bool = ..., transfer_path: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., config: _Optional[_Iterable[_Union[ConfigValue, _Mapping]]] = ..., rooms_by_phase: _Optional[_Mapping[str, int]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., prefills: _Optional[_Iterable[_Union[PrefillStatus, _Mapping]]] = ..., incarnation: _Optional[int] = ..., pending_claims: _Optional[int] = ..., engine_layouts: _Optional[_Iterable[_Union[_engine_layout_pb2.RegisteredEngineLayout, _Mapping]]] = ...) -> None: ...

class HandoffHolds(_message.Message):
    __slots__ = ["capacity_reported", "declarations_refused", "draining", "draining_pages", "held", "held_pages", "queued"]
    CAPACITY_REPORTED_FIELD_NUMBER: _ClassVar[int]
    DECLARATIONS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    DRAINING_PAGES_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_PAGES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    capacity_reported: bool
    declarations_refused: int
    draining: int
    draining_pages: int
    held: int
    held_pages: int
    queued: int
    def __init__(self, queued: _Optional[int] = ..., held: _Optional[int] = ..., held_pages: _Optional[int] = ..., draining: _Optional[int] = ..., draining_pages: _Optional[int] = ..., declarations_refused: _Optional[int] = ..., capacity_reported: bool = ...) -> None: ...

class PrefillStatus(_message.Message):
    __slots__ = ["active_rooms", "attn_cp_size", "attn_tp_size", "bootstrap_addr", "dp_size", "expected_ranks", "follow_bootstrap_room", "last_heartbeat", "lease_id", "liveness", "missed_heartbeats", "pp_size", "registered_ranks", "registered_via", "silent_rank_count", "silent_ranks"]
    ACTIVE_ROOMS_FIELD_NUMBER: _ClassVar[int]
    ATTN_CP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ATTN_TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_RANKS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_BOOTSTRAP_ROOM_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    MISSED_HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_RANKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_VIA_FIELD_NUMBER: _ClassVar[int]
    SILENT_RANKS_FIELD_NUMBER: _ClassVar[int]
    SILENT_RANK_COUNT_FIELD_NUMBER: _ClassVar[int]
    active_rooms: int
    attn_cp_size: int
    attn_tp_size: int
    bootstrap_addr: str
    dp_size: int
    expected_ranks: int
    follow_bootstrap_room: bool
    last_heartbeat: _timestamp_pb2.Timestamp
    lease_id: int
    liveness: str
    missed_heartbeats: int
    pp_size: int
    registered_ranks: int
    registered_via: str
    silent_rank_count: int
    silent_ranks: _containers.RepeatedCompositeFieldContainer[SilentRank]
    def __init__(self, bootstrap_addr: _Optional[str] = ..., registered_ranks: _Optional[int] = ..., expected_ranks: _Optional[int] = ..., attn_tp_size: _Optional[int] = ..., dp_size: _Optional[int] = ..., pp_size: _Optional[int] = ..., attn_cp_size: _Optional[int] = ..., follow_bootstrap_room: bool = ..., last_heartbeat: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., missed_heartbeats: _Optional[int] = ..., active_rooms: _Optional[int] = ..., silent_ranks: _Optional[_Iterable[_Union[SilentRank, _Mapping]]] = ..., silent_rank_count: _Optional[int] = ..., liveness: _Optional[str] = ..., lease_id: _Optional[int] = ..., registered_via: _Optional[str] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ["admitted", "blocked_by", "claimed", "dp_rank", "draining_pages", "draining_rooms", "held", "holds", "metadata_slots_free", "metadata_slots_total", "pages_free", "pages_total", "queued", "req_slots_free", "req_slots_total", "retracted", "running", "state_slots_free", "state_slots_total", "waiting"]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DRAINING_PAGES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_ROOMS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    METADATA_SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGES_FREE_FIELD_NUMBER: _ClassVar[int]
    PAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    REQ_SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    REQ_SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RETRACTED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    STATE_SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    STATE_SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    admitted: int
    blocked_by: str
    claimed: int
    dp_rank: int
    draining_pages: int
    draining_rooms: int
    held: int
    holds: HandoffHolds
    metadata_slots_free: int
    metadata_slots_total: int
    pages_free: int
    pages_total: int
    queued: int
    req_slots_free: int
    req_slots_total: int
    retracted: int
    running: int
    state_slots_free: int
    state_slots_total: int
    waiting: int
    def __init__(self, dp_rank: _Optional[int] = ..., pages_total: _Optional[int] = ..., pages_free: _Optional[int] = ..., req_slots_total: _Optional[int] = ..., req_slots_free: _Optional[int] = ..., metadata_slots_total: _Optional[int] = ..., metadata_slots_free: _Optional[int] = ..., waiting: _Optional[int] = ..., queued: _Optional[int] = ..., admitted: _Optional[int] = ..., claimed: _Optional[int] = ..., running: _Optional[int] = ..., retracted: _Optional[int] = ..., held: _Optional[int] = ..., blocked_by: _Optional[str] = ..., state_slots_total: _Optional[int] = ..., state_slots_free: _Optional[int] = ..., draining_rooms: _Optional[int] = ..., draining_pages: _Optional[int] = ..., holds: _Optional[_Union[HandoffHolds, _Mapping]] = ...) -> None: ...

class SilentRank(_message.Message):
    __slots__ = ["missed_heartbeats", "rank", "silent_for"]
    MISSED_HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SILENT_FOR_FIELD_NUMBER: _ClassVar[int]
    missed_heartbeats: int
    rank: _common_pb2.PrefillRank
    silent_for: _duration_pb2.Duration
    def __init__(self, rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., silent_for: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., missed_heartbeats: _Optional[int] = ...) -> None: ...
