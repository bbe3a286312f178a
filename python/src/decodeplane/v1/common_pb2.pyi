from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
DP_RANK_RULE_BINDING: DPRankRule
DP_RANK_RULE_FOLLOW_ROOM: DPRankRule
DP_RANK_RULE_HINT: DPRankRule
DP_RANK_RULE_SINGLE_DP: DPRankRule
DP_RANK_RULE_UNSPECIFIED: DPRankRule
FAILURE_CODE_ABORTED: FailureCode
FAILURE_CODE_BOOTSTRAP_TIMEOUT: FailureCode
FAILURE_CODE_CLAIM_TIMEOUT: FailureCode
FAILURE_CODE_DEADLINE_EXCEEDED: FailureCode
FAILURE_CODE_DP_RANK_CONFLICT: FailureCode
FAILURE_CODE_DP_RANK_UNRESOLVED: FailureCode
FAILURE_CODE_METADATA_CORRUPTION: FailureCode
FAILURE_CODE_PREFILL_LOST: FailureCode
FAILURE_CODE_PREFILL_UNAVAILABLE: FailureCode
FAILURE_CODE_RETRACT_TIMEOUT: FailureCode
FAILURE_CODE_SHUTDOWN: FailureCode
FAILURE_CODE_STAGING_FAILED: FailureCode
FAILURE_CODE_TRANSFER_FAILED: FailureCode
FAILURE_CODE_UNSPECIFIED: FailureCode
FAILURE_CODE_WAITING_TIMEOUT: FailureCode
KV_POLL_BOOTSTRAPPING: KVPoll
KV_POLL_FAILED: KVPoll
KV_POLL_SUCCESS: KVPoll
KV_POLL_TRANSFERRING: KVPoll
KV_POLL_WAITING_FOR_INPUT: KVPoll
ROOM_PHASE_ADMITTED: RoomPhase
ROOM_PHASE_CLAIMED: RoomPhase
ROOM_PHASE_FAILED: RoomPhase
ROOM_PHASE_HELD: RoomPhase
ROOM_PHASE_QUEUED: RoomPhase
ROOM_PHASE_RELEASED: RoomPhase
ROOM_PHASE_RESOLVING_DP_RANK: RoomPhase
ROOM_PHASE_RETRACTED: RoomPhase
ROOM_PHASE_SUCCEEDED: RoomPhase
ROOM_PHASE_TRANSFERRING: RoomPhase
ROOM_PHASE_UNSPECIFIED: RoomPhase
ROOM_PHASE_WAITING_PREFILL: RoomPhase
STATE_TYPE_DSA: StateType
STATE_TYPE_MAMBA: StateType
STATE_TYPE_SWA: StateType
STATE_TYPE_UNSPECIFIED: StateType

class Failure(_message.Message):
    __slots__ = ["code", "from_another_rank", "message"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    FROM_ANOTHER_RANK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: FailureCode
    from_another_rank: bool
    message: str
    def __init__(self, code: _Optional[_Union[FailureCode, str]] = ..., message: _Optional[str] = ..., from_another_rank: bool = ...) -> None: ...

class Fingerprint(_message.Message):
    __slots__ = ["digest", "head_dim", "kv_cache_dtype", "kv_lora_rank", "kv_pool_kind", "model_name", "model_revision", "num_layers", "page_owner", "page_size", "qk_rope_head_dim", "total_kv_heads"]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    KV_POOL_KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_REVISION_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    PAGE_OWNER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    QK_ROPE_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    digest: str
    head_dim: int
    kv_cache_dtype: str
    kv_lora_rank: int
    kv_pool_kind: str
    model_name: str
    model_revision: str
    num_layers: int
    page_owner: str
    page_size: int
    qk_rope_head_dim: int
    total_kv_heads: int
    def __init__(self, page_size: _Optional[int] = ..., kv_cache_dtype: _Optional[str] = ..., kv_pool_kind: _Optional[str] = ..., num_layers: _Optional[int] = ..., total_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., kv_lora_rank: _Optional[int] = ..., qk_rope_head_dim: _Optional[int] = ..., page_owner: _Optional[str] = ..., model_name: _Optional[str] = ..., model_revision: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class KVLayout(_message.Message):
    __slots__ = ["attn_tp_size", "dcp_size", "dp_size", "dtype_bytes", "head_dim", "heads_per_rank", "is_mla", "item_len", "kind", "kv_cache_dtype", "num_layers", "page_owner", "page_size", "pp_size", "staging_enabled", "state_types", "token_bytes", "total_kv_heads", "total_pages"]
    ATTN_TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DCP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEADS_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    IS_MLA_FIELD_NUMBER: _ClassVar[int]
    ITEM_LEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    PAGE_OWNER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    STAGING_ENABLED_FIELD_NUMBER: _ClassVar[int]
    STATE_TYPES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PAGES_FIELD_NUMBER: _ClassVar[int]
    attn_tp_size: int
    dcp_size: int
    dp_size: int
    dtype_bytes: int
    head_dim: int
    heads_per_rank: int
    is_mla: bool
    item_len: int
    kind: str
    kv_cache_dtype: str
    num_layers: int
    page_owner: str
    page_size: int
    pp_size: int
    staging_enabled: bool
    state_types: _containers.RepeatedScalarFieldContainer[StateType]
    token_bytes: int
    total_kv_heads: int
    total_pages: int
    def __init__(self, kind: _Optional[str] = ..., is_mla: bool = ..., num_layers: _Optional[int] = ..., total_kv_heads: _Optional[int] = ..., heads_per_rank: _Optional[int] = ..., head_dim: _Optional[int] = ..., kv_cache_dtype: _Optional[str] = ..., dtype_bytes: _Optional[int] = ..., page_size: _Optional[int] = ..., attn_tp_size: _Optional[int] = ..., dp_size: _Optional[int] = ..., pp_size: _Optional[int] = ..., dcp_size: _Optional[int] = ..., token_bytes: _Optional[int] = ..., item_len: _Optional[int] = ..., state_types: _Optional[_Iterable[_Union[StateType, str]]] = ..., staging_enabled: bool = ..., total_pages: _Optional[int] = ..., page_owner: _Optional[str] = ...) -> None: ...

class PrefillRank(_message.Message):
    __slots__ = ["bootstrap_addr", "cp_rank", "dp_rank", "pp_rank", "tp_rank"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    CP_RANK_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    cp_rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    def __init__(self, bootstrap_addr: _Optional[str] = ..., dp_rank: _Optional[int] = ..., cp_rank: _Optional[int] = ..., tp_rank: _Optional[int] = ..., pp_rank: _Optional[int] = ...) -> None: ...

class StateIndices(_message.Message):
    __slots__ = ["indices", "type"]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    type: StateType
    def __init__(self, type: _Optional[_Union[StateType, str]] = ..., indices: _Optional[_Iterable[int]] = ...) -> None: ...

class Transition(_message.Message):
    __slots__ = ["at", "attempt", "note", "phase", "poll", "sglang"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    SGLANG_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    attempt: int
    note: str
    phase: RoomPhase
    poll: KVPoll
    sglang: str
    def __init__(self, phase: _Optional[_Union[RoomPhase, str]] = ..., poll: _Optional[_Union[KVPoll, str]] = ..., at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., sglang: _Optional[str] = ..., note: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class KVPoll(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RoomPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class FailureCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class StateType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class DPRankRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
