from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from decodeplane.v1 import common_pb2 as _common_pb2
from decodeplane.v1 import engine_layout_pb2 as _engine_layout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
RETRACT_MODE_REBOOTSTRAP: RetractMode
RETRACT_MODE_RETRACT: RetractMode
RETRACT_MODE_UNSPECIFIED: RetractMode

class AbortRoomRequest(_message.Message):
    __slots__ = ["reason", "room"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    reason: str
    room: int
    def __init__(self, room: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortRoomResponse(_message.Message):
    __slots__ = ["already_terminal", "room"]
    ALREADY_TERMINAL_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    already_terminal: bool
    room: Room
    def __init__(self, room: _Optional[_Union[Room, _Mapping]] = ..., already_terminal: bool = ...) -> None: ...

class AckRoomEndRequest(_message.Message):
    __slots__ = ["attempt", "incarnation", "rank", "room"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    incarnation: int
    rank: _common_pb2.PrefillRank
    room: int
    def __init__(self, room: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., attempt: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class AckRoomEndResponse(_message.Message):
    __slots__ = ["owed", "released", "remaining"]
    OWED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    owed: bool
    released: bool
    remaining: int
    def __init__(self, owed: bool = ..., remaining: _Optional[int] = ..., released: bool = ...) -> None: ...

class Aux(_message.Message):
    __slots__ = ["output_ids", "room_marker"]
    OUTPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    ROOM_MARKER_FIELD_NUMBER: _ClassVar[int]
    output_ids: _containers.RepeatedScalarFieldContainer[int]
    room_marker: int
    def __init__(self, room_marker: _Optional[int] = ..., output_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AwaitDestinationRequest(_message.Message):
    __slots__ = ["incarnation", "rank", "room"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    rank: _common_pb2.PrefillRank
    room: int
    def __init__(self, room: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ContinueGenerationRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ContinueGenerationResponse(_message.Message):
    __slots__ = ["resumed", "rooms"]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    resumed: _containers.RepeatedCompositeFieldContainer[ResumedRoom]
    rooms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rooms: _Optional[_Iterable[int]] = ..., resumed: _Optional[_Iterable[_Union[ResumedRoom, _Mapping]]] = ...) -> None: ...

class DeclareDestinationRequest(_message.Message):
    __slots__ = ["decode_prefix_len", "metadata_slot", "page_indices", "room", "state"]
    DECODE_PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    METADATA_SLOT_FIELD_NUMBER: _ClassVar[int]
    PAGE_INDICES_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    decode_prefix_len: int
    metadata_slot: int
    page_indices: _containers.RepeatedScalarFieldContainer[int]
    room: int
    state: _containers.RepeatedCompositeFieldContainer[_common_pb2.StateIndices]
    def __init__(self, room: _Optional[int] = ..., page_indices: _Optional[_Iterable[int]] = ..., metadata_slot: _Optional[int] = ..., state: _Optional[_Iterable[_Union[_common_pb2.StateIndices, _Mapping]]] = ..., decode_prefix_len: _Optional[int] = ...) -> None: ...

class DeclareDestinationResponse(_message.Message):
    __slots__ = ["already", "room"]
    ALREADY_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    already: bool
    room: Room
    def __init__(self, room: _Optional[_Union[Room, _Mapping]] = ..., already: bool = ...) -> None: ...

class DecodeTarget(_message.Message):
    __slots__ = ["decode_tp_rank", "dst_head_start", "dummy", "layout_id", "num_heads", "src_head_start"]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    DST_HEAD_START_FIELD_NUMBER: _ClassVar[int]
    DUMMY_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    SRC_HEAD_START_FIELD_NUMBER: _ClassVar[int]
    decode_tp_rank: int
    dst_head_start: int
    dummy: bool
    layout_id: int
    num_heads: int
    src_head_start: int
    def __init__(self, decode_tp_rank: _Optional[int] = ..., dummy: bool = ..., src_head_start: _Optional[int] = ..., dst_head_start: _Optional[int] = ..., num_heads: _Optional[int] = ..., layout_id: _Optional[int] = ...) -> None: ...

class Destination(_message.Message):
    __slots__ = ["attempt", "aux_bytes", "decode_dp_rank", "decode_prefix_len", "dummy", "fill_len", "incarnation", "metadata_slot", "page_bytes", "page_indices", "page_size", "required_dst_info_num", "room", "staging", "state_bytes", "state_indices", "targets", "token_bytes"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AUX_BYTES_FIELD_NUMBER: _ClassVar[int]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DECODE_PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    DUMMY_FIELD_NUMBER: _ClassVar[int]
    FILL_LEN_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    METADATA_SLOT_FIELD_NUMBER: _ClassVar[int]
    PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAGE_INDICES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_DST_INFO_NUM_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    STAGING_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_INDICES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    aux_bytes: int
    decode_dp_rank: int
    decode_prefix_len: int
    dummy: bool
    fill_len: int
    incarnation: int
    metadata_slot: int
    page_bytes: int
    page_indices: _containers.RepeatedScalarFieldContainer[int]
    page_size: int
    required_dst_info_num: int
    room: int
    staging: bool
    state_bytes: int
    state_indices: _containers.RepeatedCompositeFieldContainer[_common_pb2.StateIndices]
    targets: _containers.RepeatedCompositeFieldContainer[DecodeTarget]
    token_bytes: int
    def __init__(self, room: _Optional[int] = ..., decode_dp_rank: _Optional[int] = ..., page_indices: _Optional[_Iterable[int]] = ..., page_size: _Optional[int] = ..., fill_len: _Optional[int] = ..., metadata_slot: _Optional[int] = ..., state_indices: _Optional[_Iterable[_Union[_common_pb2.StateIndices, _Mapping]]] = ..., required_dst_info_num: _Optional[int] = ..., decode_prefix_len: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[DecodeTarget, _Mapping]]] = ..., dummy: bool = ..., staging: bool = ..., attempt: _Optional[int] = ..., token_bytes: _Optional[int] = ..., state_bytes: _Optional[int] = ..., incarnation: _Optional[int] = ..., page_bytes: _Optional[int] = ..., aux_bytes: _Optional[int] = ...) -> None: ...

class DestinationEvent(_message.Message):
    __slots__ = ["ack_required", "destination", "done", "failure"]
    ACK_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ack_required: bool
    destination: Destination
    done: RoomDone
    failure: _common_pb2.Failure
    def __init__(self, destination: _Optional[_Union[Destination, _Mapping]] = ..., failure: _Optional[_Union[_common_pb2.Failure, _Mapping]] = ..., done: _Optional[_Union[RoomDone, _Mapping]] = ..., ack_required: bool = ...) -> None: ...

class GetRoomRequest(_message.Message):
    __slots__ = ["include_pages", "room"]
    INCLUDE_PAGES_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    include_pages: bool
    room: int
    def __init__(self, room: _Optional[int] = ..., include_pages: bool = ...) -> None: ...

class GrownPages(_message.Message):
    __slots__ = ["new_page_indices", "room"]
    NEW_PAGE_INDICES_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    new_page_indices: _containers.RepeatedScalarFieldContainer[int]
    room: int
    def __init__(self, room: _Optional[int] = ..., new_page_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class ListRoomsRequest(_message.Message):
    __slots__ = ["bootstrap_addr", "limit", "live_only", "newest_first", "phases"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIVE_ONLY_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    limit: int
    live_only: bool
    newest_first: bool
    phases: _containers.RepeatedScalarFieldContainer[_common_pb2.RoomPhase]
    def __init__(self, phases: _Optional[_Iterable[_Union[_common_pb2.RoomPhase, str]]] = ..., bootstrap_addr: _Optional[str] = ..., limit: _Optional[int] = ..., live_only: bool = ..., newest_first: bool = ...) -> None: ...

class ListRoomsResponse(_message.Message):
    __slots__ = ["rooms", "total"]
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    rooms: _containers.RepeatedCompositeFieldContainer[Room]
    total: int
    def __init__(self, rooms: _Optional[_Iterable[_Union[Room, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class OpenRoomRequest(_message.Message):
    __slots__ = ["bootstrap_addr", "decode_dp_rank", "idempotency_key", "max_new_tokens", "output_len", "prefill_dp_rank", "priority", "prompt_len", "rebootstrap", "rid", "room", "timeout"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    REBOOTSTRAP_FIELD_NUMBER: _ClassVar[int]
    RID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    decode_dp_rank: int
    idempotency_key: str
    max_new_tokens: int
    output_len: int
    prefill_dp_rank: int
    priority: int
    prompt_len: int
    rebootstrap: bool
    rid: str
    room: int
    timeout: _duration_pb2.Duration
    def __init__(self, rid: _Optional[str] = ..., bootstrap_addr: _Optional[str] = ..., room: _Optional[int] = ..., prefill_dp_rank: _Optional[int] = ..., decode_dp_rank: _Optional[int] = ..., prompt_len: _Optional[int] = ..., output_len: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., priority: _Optional[int] = ..., rebootstrap: bool = ..., idempotency_key: _Optional[str] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class OpenRoomResponse(_message.Message):
    __slots__ = ["existing", "room"]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    existing: bool
    room: Room
    def __init__(self, room: _Optional[_Union[Room, _Mapping]] = ..., existing: bool = ...) -> None: ...

class PhaseTime(_message.Message):
    __slots__ = ["phase", "spent"]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SPENT_FIELD_NUMBER: _ClassVar[int]
    phase: _common_pb2.RoomPhase
    spent: _duration_pb2.Duration
    def __init__(self, phase: _Optional[_Union[_common_pb2.RoomPhase, str]] = ..., spent: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RankCoverage(_message.Message):
    __slots__ = ["bytes", "claimed", "cp_rank", "last_landed", "pages_landed", "pages_required", "pp_rank", "tp_rank"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    CP_RANK_FIELD_NUMBER: _ClassVar[int]
    LAST_LANDED_FIELD_NUMBER: _ClassVar[int]
    PAGES_LANDED_FIELD_NUMBER: _ClassVar[int]
    PAGES_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    PP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    claimed: bool
    cp_rank: int
    last_landed: bool
    pages_landed: int
    pages_required: int
    pp_rank: int
    tp_rank: int
    def __init__(self, cp_rank: _Optional[int] = ..., tp_rank: _Optional[int] = ..., pp_rank: _Optional[int] = ..., claimed: bool = ..., pages_landed: _Optional[int] = ..., pages_required: _Optional[int] = ..., last_landed: bool = ..., bytes: _Optional[int] = ...) -> None: ...

class ReleaseRoomRequest(_message.Message):
    __slots__ = ["room"]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    room: int
    def __init__(self, room: _Optional[int] = ...) -> None: ...

class ReleaseRoomResponse(_message.Message):
    __slots__ = ["already_released", "pages_released"]
    ALREADY_RELEASED_FIELD_NUMBER: _ClassVar[int]
    PAGES_RELEASED_FIELD_NUMBER: _ClassVar[int]
    already_released: bool
    pages_released: int
    def __init__(self, pages_released: _Optional[int] = ..., already_released: bool = ...) -> None: ...

class ReportRunningRequest(_message.Message):
    __slots__ = ["rooms"]
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    rooms: _containers.RepeatedCompositeFieldContainer[RunningUsage]
    def __init__(self, rooms: _Optional[_Iterable[_Union[RunningUsage, _Mapping]]] = ...) -> None: ...

class ReportRunningResponse(_message.Message):
    __slots__ = ["grown", "no_capacity", "retry_after"]
    GROWN_FIELD_NUMBER: _ClassVar[int]
    NO_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    grown: _containers.RepeatedCompositeFieldContainer[GrownPages]
    no_capacity: _containers.RepeatedScalarFieldContainer[int]
    retry_after: _duration_pb2.Duration
    def __init__(self, grown: _Optional[_Iterable[_Union[GrownPages, _Mapping]]] = ..., no_capacity: _Optional[_Iterable[int]] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReportTransferRequest(_message.Message):
    __slots__ = ["attempt", "bytes", "chunk_index", "failure_reason", "incarnation", "last", "metadata_room_marker", "num_pages", "page_offset", "rank", "room", "success"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    METADATA_ROOM_MARKER_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    bytes: int
    chunk_index: int
    failure_reason: str
    incarnation: int
    last: bool
    metadata_room_marker: int
    num_pages: int
    page_offset: int
    rank: _common_pb2.PrefillRank
    room: int
    success: bool
    def __init__(self, room: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., chunk_index: _Optional[int] = ..., page_offset: _Optional[int] = ..., num_pages: _Optional[int] = ..., last: bool = ..., success: bool = ..., failure_reason: _Optional[str] = ..., bytes: _Optional[int] = ..., metadata_room_marker: _Optional[int] = ..., attempt: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ReportTransferResponse(_message.Message):
    __slots__ = ["duplicate", "poll"]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    poll: _common_pb2.KVPoll
    def __init__(self, poll: _Optional[_Union[_common_pb2.KVPoll, str]] = ..., duplicate: bool = ...) -> None: ...

class ResumedRoom(_message.Message):
    __slots__ = ["attempt", "generate_url", "phase", "prefill_bootstrap_addr", "prefill_dp_rank", "prefill_http_host", "prefill_http_port", "rid", "room"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GENERATE_URL_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PREFILL_HTTP_HOST_FIELD_NUMBER: _ClassVar[int]
    PREFILL_HTTP_PORT_FIELD_NUMBER: _ClassVar[int]
    RID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    generate_url: str
    phase: _common_pb2.RoomPhase
    prefill_bootstrap_addr: str
    prefill_dp_rank: int
    prefill_http_host: str
    prefill_http_port: int
    rid: str
    room: int
    def __init__(self, room: _Optional[int] = ..., rid: _Optional[str] = ..., attempt: _Optional[int] = ..., phase: _Optional[_Union[_common_pb2.RoomPhase, str]] = ..., prefill_bootstrap_addr: _Optional[str] = ..., prefill_http_host: _Optional[str] = ..., prefill_http_port: _Optional[int] = ..., generate_url: _Optional[str] = ..., prefill_dp_rank: _Optional[int] = ...) -> None: ...

class ResyncRequest(_message.Message):
    __slots__ = ["done", "rooms"]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    done: bool
    rooms: _containers.RepeatedCompositeFieldContainer[ResyncRoom]
    def __init__(self, rooms: _Optional[_Iterable[_Union[ResyncRoom, _Mapping]]] = ..., done: bool = ...) -> None: ...

class ResyncResponse(_message.Message):
    __slots__ = ["admitting", "adopted", "declared", "pages"]
    ADMITTING_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    admitting: bool
    adopted: int
    declared: int
    pages: int
    def __init__(self, adopted: _Optional[int] = ..., declared: _Optional[int] = ..., pages: _Optional[int] = ..., admitting: bool = ...) -> None: ...

class ResyncRoom(_message.Message):
    __slots__ = ["bootstrap_addr", "decode_dp_rank", "decode_prefix_len", "in_flight", "mamba_slots", "max_new_tokens", "metadata_slot", "output_len", "page_indices", "prefill_dp_rank", "prompt_len", "req_slot", "rid", "room", "state", "swa_page_indices"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DECODE_PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAMBA_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    METADATA_SLOT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    PAGE_INDICES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    REQ_SLOT_FIELD_NUMBER: _ClassVar[int]
    RID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SWA_PAGE_INDICES_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    decode_dp_rank: int
    decode_prefix_len: int
    in_flight: bool
    mamba_slots: _containers.RepeatedScalarFieldContainer[int]
    max_new_tokens: int
    metadata_slot: int
    output_len: int
    page_indices: _containers.RepeatedScalarFieldContainer[int]
    prefill_dp_rank: int
    prompt_len: int
    req_slot: int
    rid: str
    room: int
    state: _containers.RepeatedCompositeFieldContainer[_common_pb2.StateIndices]
    swa_page_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, room: _Optional[int] = ..., rid: _Optional[str] = ..., prompt_len: _Optional[int] = ..., output_len: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., decode_dp_rank: _Optional[int] = ..., req_slot: _Optional[int] = ..., page_indices: _Optional[_Iterable[int]] = ..., swa_page_indices: _Optional[_Iterable[int]] = ..., mamba_slots: _Optional[_Iterable[int]] = ..., bootstrap_addr: _Optional[str] = ..., prefill_dp_rank: _Optional[int] = ..., in_flight: bool = ..., metadata_slot: _Optional[int] = ..., state: _Optional[_Iterable[_Union[_common_pb2.StateIndices, _Mapping]]] = ..., decode_prefix_len: _Optional[int] = ...) -> None: ...

class RetractRoomRequest(_message.Message):
    __slots__ = ["mode", "room"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    mode: RetractMode
    room: int
    def __init__(self, room: _Optional[int] = ..., mode: _Optional[_Union[RetractMode, str]] = ...) -> None: ...

class RetractRoomResponse(_message.Message):
    __slots__ = ["room"]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    room: Room
    def __init__(self, room: _Optional[_Union[Room, _Mapping]] = ...) -> None: ...

class Room(_message.Message):
    __slots__ = ["attempt", "bootstrap_addr", "bytes_transferred", "chunks_done", "coverage", "deadline", "decode_dp_rank", "dp_rank_rule", "failure", "max_new_tokens", "metadata_slot", "num_pages", "opened_at", "page_indices", "phase", "phase_times", "poll", "prefill_dp_rank", "priority", "prompt_len", "rid", "room", "staging", "timeout", "trace_id", "transitions", "updated_at", "waiting_for"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    BYTES_TRANSFERRED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_DONE_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_RULE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    METADATA_SLOT_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    PAGE_INDICES_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_TIMES_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    RID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    STAGING_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    bootstrap_addr: str
    bytes_transferred: int
    chunks_done: int
    coverage: _containers.RepeatedCompositeFieldContainer[RankCoverage]
    deadline: _timestamp_pb2.Timestamp
    decode_dp_rank: int
    dp_rank_rule: _common_pb2.DPRankRule
    failure: _common_pb2.Failure
    max_new_tokens: int
    metadata_slot: int
    num_pages: int
    opened_at: _timestamp_pb2.Timestamp
    page_indices: _containers.RepeatedScalarFieldContainer[int]
    phase: _common_pb2.RoomPhase
    phase_times: _containers.RepeatedCompositeFieldContainer[PhaseTime]
    poll: _common_pb2.KVPoll
    prefill_dp_rank: int
    priority: int
    prompt_len: int
    rid: str
    room: int
    staging: bool
    timeout: _duration_pb2.Duration
    trace_id: str
    transitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Transition]
    updated_at: _timestamp_pb2.Timestamp
    waiting_for: str
    def __init__(self, room: _Optional[int] = ..., rid: _Optional[str] = ..., bootstrap_addr: _Optional[str] = ..., decode_dp_rank: _Optional[int] = ..., prefill_dp_rank: _Optional[int] = ..., dp_rank_rule: _Optional[_Union[_common_pb2.DPRankRule, str]] = ..., poll: _Optional[_Union[_common_pb2.KVPoll, str]] = ..., phase: _Optional[_Union[_common_pb2.RoomPhase, str]] = ..., failure: _Optional[_Union[_common_pb2.Failure, _Mapping]] = ..., prompt_len: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., priority: _Optional[int] = ..., num_pages: _Optional[int] = ..., metadata_slot: _Optional[int] = ..., bytes_transferred: _Optional[int] = ..., chunks_done: _Optional[int] = ..., opened_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ..., transitions: _Optional[_Iterable[_Union[_common_pb2.Transition, _Mapping]]] = ..., page_indices: _Optional[_Iterable[int]] = ..., trace_id: _Optional[str] = ..., staging: bool = ..., coverage: _Optional[_Iterable[_Union[RankCoverage, _Mapping]]] = ..., waiting_for: _Optional[str] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., phase_times: _Optional[_Iterable[_Union[PhaseTime, _Mapping]]] = ...) -> None: ...

class RoomDone(_message.Message):
    __slots__ = ["phase", "poll"]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    phase: _common_pb2.RoomPhase
    poll: _common_pb2.KVPoll
    def __init__(self, poll: _Optional[_Union[_common_pb2.KVPoll, str]] = ..., phase: _Optional[_Union[_common_pb2.RoomPhase, str]] = ...) -> None: ...

class RoomEvent(_message.Message):
    __slots__ = ["incarnation", "pages_reusable", "room", "terminal", "transition"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PAGES_REUSABLE_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    pages_reusable: bool
    room: Room
    terminal: bool
    transition: _common_pb2.Transition
    def __init__(self, room: _Optional[_Union[Room, _Mapping]] = ..., transition: _Optional[_Union[_common_pb2.Transition, _Mapping]] = ..., terminal: bool = ..., incarnation: _Optional[int] = ..., pages_reusable: bool = ...) -> None: ...

class RunningUsage(_message.Message):
    __slots__ = ["output_len", "room"]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    output_len: int
    room: int
    def __init__(self, room: _Optional[int] = ..., output_len: _Optional[int] = ...) -> None: ...

class TransferRequest(_message.Message):
    __slots__ = ["attempt", "aux", "chunk_index", "incarnation", "last", "num_pages", "page_offset", "rank", "room", "source"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AUX_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    aux: Aux
    chunk_index: int
    incarnation: int
    last: bool
    num_pages: int
    page_offset: int
    rank: _common_pb2.PrefillRank
    room: int
    source: TransferSource
    def __init__(self, room: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., chunk_index: _Optional[int] = ..., page_offset: _Optional[int] = ..., num_pages: _Optional[int] = ..., last: bool = ..., source: _Optional[_Union[TransferSource, _Mapping]] = ..., aux: _Optional[_Union[Aux, _Mapping]] = ..., attempt: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class TransferResponse(_message.Message):
    __slots__ = ["bytes", "duplicate", "duration", "poll"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    duplicate: bool
    duration: _duration_pb2.Duration
    poll: _common_pb2.KVPoll
    def __init__(self, bytes: _Optional[int] = ..., duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., poll: _Optional[_Union[_common_pb2.KVPoll, str]] = ..., duplicate: bool = ...) -> None: ...

class TransferSource(_message.Message):
    __slots__ = ["aux_row", "buffer", "page_indices", "state"]
    AUX_ROW_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    PAGE_INDICES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    aux_row: int
    buffer: str
    page_indices: _containers.RepeatedScalarFieldContainer[int]
    state: _containers.RepeatedCompositeFieldContainer[_common_pb2.StateIndices]
    def __init__(self, buffer: _Optional[str] = ..., page_indices: _Optional[_Iterable[int]] = ..., aux_row: _Optional[int] = ..., state: _Optional[_Iterable[_Union[_common_pb2.StateIndices, _Mapping]]] = ...) -> None: ...

class WatchRoomRequest(_message.Message):
    __slots__ = ["history", "room"]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    history: bool
    room: int
    def __init__(self, room: _Optional[int] = ..., history: bool = ...) -> None: ...

class RetractMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
