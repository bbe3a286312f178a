from google.protobuf import duration_pb2 as _duration_pb2
from decodeplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BindRoomRequest(_message.Message):
    __slots__ = ["bootstrap_addr", "dp_rank", "room"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    dp_rank: int
    room: int
    def __init__(self, bootstrap_addr: _Optional[str] = ..., room: _Optional[int] = ..., dp_rank: _Optional[int] = ...) -> None: ...

class BindRoomResponse(_message.Message):
    __slots__ = ["replaced"]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    replaced: bool
    def __init__(self, replaced: bool = ...) -> None: ...

class DPRankResult(_message.Message):
    __slots__ = ["dp_rank", "room", "rule"]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    dp_rank: int
    room: int
    rule: _common_pb2.DPRankRule
    def __init__(self, room: _Optional[int] = ..., dp_rank: _Optional[int] = ..., rule: _Optional[_Union[_common_pb2.DPRankRule, str]] = ...) -> None: ...

class DecodeRankMapping(_message.Message):
    __slots__ = ["decode_tp_rank", "dummy_tp_ranks", "required_dst_info_num", "required_prefill_response_num", "target_cp_ranks", "target_pp_ranks", "target_tp_rank", "target_tp_ranks"]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    DUMMY_TP_RANKS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_DST_INFO_NUM_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_PREFILL_RESPONSE_NUM_FIELD_NUMBER: _ClassVar[int]
    TARGET_CP_RANKS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PP_RANKS_FIELD_NUMBER: _ClassVar[int]
    TARGET_TP_RANKS_FIELD_NUMBER: _ClassVar[int]
    TARGET_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    decode_tp_rank: int
    dummy_tp_ranks: _containers.RepeatedScalarFieldContainer[int]
    required_dst_info_num: int
    required_prefill_response_num: int
    target_cp_ranks: _containers.RepeatedScalarFieldContainer[int]
    target_pp_ranks: _containers.RepeatedScalarFieldContainer[int]
    target_tp_rank: int
    target_tp_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, decode_tp_rank: _Optional[int] = ..., target_tp_ranks: _Optional[_Iterable[int]] = ..., target_tp_rank: _Optional[int] = ..., target_cp_ranks: _Optional[_Iterable[int]] = ..., target_pp_ranks: _Optional[_Iterable[int]] = ..., required_dst_info_num: _Optional[int] = ..., required_prefill_response_num: _Optional[int] = ..., dummy_tp_ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class DeregisterPrefillRequest(_message.Message):
    __slots__ = ["bootstrap_addr", "instance_id", "reason"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    instance_id: str
    reason: str
    def __init__(self, bootstrap_addr: _Optional[str] = ..., instance_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DeregisterPrefillResponse(_message.Message):
    __slots__ = ["deregistered", "rooms_failed"]
    DEREGISTERED_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FAILED_FIELD_NUMBER: _ClassVar[int]
    deregistered: bool
    rooms_failed: int
    def __init__(self, deregistered: bool = ..., rooms_failed: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ["instance_id", "rank"]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    rank: _common_pb2.PrefillRank
    def __init__(self, rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., instance_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ["incarnation", "interval", "max_failures"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MAX_FAILURES_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    interval: _duration_pb2.Duration
    max_failures: int
    def __init__(self, interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., max_failures: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class LookupDPRanksRequest(_message.Message):
    __slots__ = ["bootstrap_addr", "hints", "rooms"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    HINTS_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    hints: _containers.RepeatedCompositeFieldContainer[RoomHint]
    rooms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, bootstrap_addr: _Optional[str] = ..., rooms: _Optional[_Iterable[int]] = ..., hints: _Optional[_Iterable[_Union[RoomHint, _Mapping]]] = ...) -> None: ...

class LookupDPRanksResponse(_message.Message):
    __slots__ = ["resolved", "unresolved"]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_FIELD_NUMBER: _ClassVar[int]
    resolved: _containers.RepeatedCompositeFieldContainer[DPRankResult]
    unresolved: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, resolved: _Optional[_Iterable[_Union[DPRankResult, _Mapping]]] = ..., unresolved: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelFacts(_message.Message):
    __slots__ = ["head_dim", "kv_lora_rank", "kv_pool_kind", "model_name", "model_revision", "num_layers", "qk_rope_head_dim", "total_kv_heads"]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    KV_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    KV_POOL_KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_REVISION_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    QK_ROPE_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    head_dim: int
    kv_lora_rank: int
    kv_pool_kind: str
    model_name: str
    model_revision: str
    num_layers: int
    qk_rope_head_dim: int
    total_kv_heads: int
    def __init__(self, kv_pool_kind: _Optional[str] = ..., num_layers: _Optional[int] = ..., total_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., kv_lora_rank: _Optional[int] = ..., qk_rope_head_dim: _Optional[int] = ..., model_name: _Optional[str] = ..., model_revision: _Optional[str] = ...) -> None: ...

class ParallelInfo(_message.Message):
    __slots__ = ["attn_cp_rank", "attn_cp_size", "attn_dp_rank", "attn_dp_size", "attn_tp_rank", "attn_tp_size", "pp_rank", "pp_size", "system_dp_rank", "system_dp_size"]
    ATTN_CP_RANK_FIELD_NUMBER: _ClassVar[int]
    ATTN_CP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ATTN_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    ATTN_DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ATTN_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    ATTN_TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_RANK_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    attn_cp_rank: int
    attn_cp_size: int
    attn_dp_rank: int
    attn_dp_size: int
    attn_tp_rank: int
    attn_tp_size: int
    pp_rank: int
    pp_size: int
    system_dp_rank: int
    system_dp_size: int
    def __init__(self, attn_tp_size: _Optional[int] = ..., attn_tp_rank: _Optional[int] = ..., attn_cp_size: _Optional[int] = ..., attn_cp_rank: _Optional[int] = ..., attn_dp_size: _Optional[int] = ..., attn_dp_rank: _Optional[int] = ..., pp_size: _Optional[int] = ..., pp_rank: _Optional[int] = ..., system_dp_size: _Optional[int] = ..., system_dp_rank: _Optional[int] = ...) -> None: ...

class PrefillRankMapping(_message.Message):
    __slots__ = ["decode_ranks", "dummy", "required_dst_info_num", "serves_decode_tp_ranks", "staging_required"]
    DECODE_RANKS_FIELD_NUMBER: _ClassVar[int]
    DUMMY_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_DST_INFO_NUM_FIELD_NUMBER: _ClassVar[int]
    SERVES_DECODE_TP_RANKS_FIELD_NUMBER: _ClassVar[int]
    STAGING_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    decode_ranks: _containers.RepeatedCompositeFieldContainer[DecodeRankMapping]
    dummy: bool
    required_dst_info_num: int
    serves_decode_tp_ranks: _containers.RepeatedScalarFieldContainer[int]
    staging_required: bool
    def __init__(self, decode_ranks: _Optional[_Iterable[_Union[DecodeRankMapping, _Mapping]]] = ..., serves_decode_tp_ranks: _Optional[_Iterable[int]] = ..., dummy: bool = ..., required_dst_info_num: _Optional[int] = ..., staging_required: bool = ...) -> None: ...

class RegisterPrefillRequest(_message.Message):
    __slots__ = ["bootstrap_addr", "enable_dsa_cache_layer_split", "instance_id", "kv_cache_dtype", "load_balance_method", "model", "page_size", "parallel", "prefill_http_port", "rank_endpoint"]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    ENABLE_DSA_CACHE_LAYER_SPLIT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LOAD_BALANCE_METHOD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_HTTP_PORT_FIELD_NUMBER: _ClassVar[int]
    RANK_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    bootstrap_addr: str
    enable_dsa_cache_layer_split: bool
    instance_id: str
    kv_cache_dtype: str
    load_balance_method: str
    model: ModelFacts
    page_size: int
    parallel: ParallelInfo
    prefill_http_port: int
    rank_endpoint: str
    def __init__(self, bootstrap_addr: _Optional[str] = ..., rank_endpoint: _Optional[str] = ..., parallel: _Optional[_Union[ParallelInfo, _Mapping]] = ..., page_size: _Optional[int] = ..., kv_cache_dtype: _Optional[str] = ..., load_balance_method: _Optional[str] = ..., enable_dsa_cache_layer_split: bool = ..., prefill_http_port: _Optional[int] = ..., model: _Optional[_Union[ModelFacts, _Mapping]] = ..., instance_id: _Optional[str] = ...) -> None: ...

class RegisterPrefillResponse(_message.Message):
    __slots__ = ["decode_layout", "expected_ranks", "heartbeat_interval", "heartbeat_max_failures", "incarnation", "mapping", "registered_ranks", "replaced", "rooms_failed"]
    DECODE_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_RANKS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MAX_FAILURES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_RANKS_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FAILED_FIELD_NUMBER: _ClassVar[int]
    decode_layout: _common_pb2.KVLayout
    expected_ranks: int
    heartbeat_interval: _duration_pb2.Duration
    heartbeat_max_failures: int
    incarnation: int
    mapping: PrefillRankMapping
    registered_ranks: int
    replaced: bool
    rooms_failed: int
    def __init__(self, decode_layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., mapping: _Optional[_Union[PrefillRankMapping, _Mapping]] = ..., heartbeat_interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., heartbeat_max_failures: _Optional[int] = ..., registered_ranks: _Optional[int] = ..., expected_ranks: _Optional[int] = ..., replaced: bool = ..., rooms_failed: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class RoomHint(_message.Message):
    __slots__ = ["dp_rank", "room"]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    dp_rank: int
    room: int
    def __init__(self, room: _Optional[int] = ..., dp_rank: _Optional[int] = ...) -> None: ...
