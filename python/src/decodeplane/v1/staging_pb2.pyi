from google.protobuf import duration_pb2 as _duration_pb2
from decodeplane.v1 import common_pb2 as _common_pb2
from decodeplane.v1 import rooms_pb2 as _rooms_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllocateStagingRequest(_message.Message):
    __slots__ = ["chunk_index", "incarnation", "num_pages", "rank", "room"]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    chunk_index: int
    incarnation: int
    num_pages: int
    rank: _common_pb2.PrefillRank
    room: int
    def __init__(self, room: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., chunk_index: _Optional[int] = ..., num_pages: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class AllocateStagingResponse(_message.Message):
    __slots__ = ["regions"]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[StagingRegion]
    def __init__(self, regions: _Optional[_Iterable[_Union[StagingRegion, _Mapping]]] = ...) -> None: ...

class ChunkReadyRequest(_message.Message):
    __slots__ = ["aux", "chunk_index", "incarnation", "last", "num_pages", "page_offset", "rank", "room"]
    AUX_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    aux: _rooms_pb2.Aux
    chunk_index: int
    incarnation: int
    last: bool
    num_pages: int
    page_offset: int
    rank: _common_pb2.PrefillRank
    room: int
    def __init__(self, room: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ..., chunk_index: _Optional[int] = ..., page_offset: _Optional[int] = ..., num_pages: _Optional[int] = ..., last: bool = ..., aux: _Optional[_Union[_rooms_pb2.Aux, _Mapping]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ChunkReadyResponse(_message.Message):
    __slots__ = ["duplicate", "num_writers", "poll", "scattered", "writers_arrived"]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    NUM_WRITERS_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    SCATTERED_FIELD_NUMBER: _ClassVar[int]
    WRITERS_ARRIVED_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    num_writers: int
    poll: _common_pb2.KVPoll
    scattered: bool
    writers_arrived: int
    def __init__(self, poll: _Optional[_Union[_common_pb2.KVPoll, str]] = ..., duplicate: bool = ..., writers_arrived: _Optional[int] = ..., num_writers: _Optional[int] = ..., scattered: bool = ...) -> None: ...

class HeadSlice(_message.Message):
    __slots__ = ["decode_tp_rank", "dst_head_start", "num_heads", "prefill_tp_rank", "src_head_start"]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    DST_HEAD_START_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    SRC_HEAD_START_FIELD_NUMBER: _ClassVar[int]
    decode_tp_rank: int
    dst_head_start: int
    num_heads: int
    prefill_tp_rank: int
    src_head_start: int
    def __init__(self, prefill_tp_rank: _Optional[int] = ..., decode_tp_rank: _Optional[int] = ..., src_head_start: _Optional[int] = ..., dst_head_start: _Optional[int] = ..., num_heads: _Optional[int] = ...) -> None: ...

class SetupStagingRequest(_message.Message):
    __slots__ = ["rank"]
    RANK_FIELD_NUMBER: _ClassVar[int]
    rank: _common_pb2.PrefillRank
    def __init__(self, rank: _Optional[_Union[_common_pb2.PrefillRank, _Mapping]] = ...) -> None: ...

class SetupStagingResponse(_message.Message):
    __slots__ = ["completion_timeout", "decode_attn_tp_size", "decode_pp_size", "head_bytes", "head_slices", "num_layers", "page_size", "prefill_attn_tp_size", "prefill_pp_size", "rings", "staging_required", "targets", "total_kv_heads"]
    COMPLETION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    DECODE_ATTN_TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DECODE_PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    HEAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEAD_SLICES_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ATTN_TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    RINGS_FIELD_NUMBER: _ClassVar[int]
    STAGING_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    completion_timeout: _duration_pb2.Duration
    decode_attn_tp_size: int
    decode_pp_size: int
    head_bytes: int
    head_slices: _containers.RepeatedCompositeFieldContainer[HeadSlice]
    num_layers: int
    page_size: int
    prefill_attn_tp_size: int
    prefill_pp_size: int
    rings: _containers.RepeatedCompositeFieldContainer[StagingRing]
    staging_required: bool
    targets: _containers.RepeatedCompositeFieldContainer[StagingTarget]
    total_kv_heads: int
    def __init__(self, staging_required: bool = ..., prefill_attn_tp_size: _Optional[int] = ..., decode_attn_tp_size: _Optional[int] = ..., prefill_pp_size: _Optional[int] = ..., decode_pp_size: _Optional[int] = ..., total_kv_heads: _Optional[int] = ..., page_size: _Optional[int] = ..., head_bytes: _Optional[int] = ..., num_layers: _Optional[int] = ..., head_slices: _Optional[_Iterable[_Union[HeadSlice, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[StagingTarget, _Mapping]]] = ..., rings: _Optional[_Iterable[_Union[StagingRing, _Mapping]]] = ..., completion_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class StagingRegion(_message.Message):
    __slots__ = ["alloc_id", "buffer", "decode_tp_rank", "end", "existing", "num_pages", "num_writers", "offset", "round", "size", "writable", "writer_bytes", "writer_index", "writer_offset"]
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_WRITERS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    WRITER_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITER_INDEX_FIELD_NUMBER: _ClassVar[int]
    WRITER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    alloc_id: int
    buffer: str
    decode_tp_rank: int
    end: int
    existing: bool
    num_pages: int
    num_writers: int
    offset: int
    round: int
    size: int
    writable: bool
    writer_bytes: int
    writer_index: int
    writer_offset: int
    def __init__(self, decode_tp_rank: _Optional[int] = ..., buffer: _Optional[str] = ..., alloc_id: _Optional[int] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., round: _Optional[int] = ..., end: _Optional[int] = ..., num_pages: _Optional[int] = ..., writable: bool = ..., num_writers: _Optional[int] = ..., writer_index: _Optional[int] = ..., writer_offset: _Optional[int] = ..., writer_bytes: _Optional[int] = ..., existing: bool = ...) -> None: ...

class StagingRing(_message.Message):
    __slots__ = ["buffer", "decode_dp_rank", "decode_tp_rank", "size_bytes", "watermark"]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    decode_dp_rank: int
    decode_tp_rank: int
    size_bytes: int
    watermark: Watermark
    def __init__(self, decode_dp_rank: _Optional[int] = ..., decode_tp_rank: _Optional[int] = ..., buffer: _Optional[str] = ..., size_bytes: _Optional[int] = ..., watermark: _Optional[_Union[Watermark, _Mapping]] = ...) -> None: ...

class StagingTarget(_message.Message):
    __slots__ = ["decode_tp_rank", "num_writers", "region_bytes_per_token", "slice", "writer", "writers"]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_WRITERS_FIELD_NUMBER: _ClassVar[int]
    REGION_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    decode_tp_rank: int
    num_writers: int
    region_bytes_per_token: int
    slice: HeadSlice
    writer: StagingWriterLayout
    writers: _containers.RepeatedCompositeFieldContainer[StagingWriterLayout]
    def __init__(self, decode_tp_rank: _Optional[int] = ..., slice: _Optional[_Union[HeadSlice, _Mapping]] = ..., num_writers: _Optional[int] = ..., writer: _Optional[_Union[StagingWriterLayout, _Mapping]] = ..., writers: _Optional[_Iterable[_Union[StagingWriterLayout, _Mapping]]] = ..., region_bytes_per_token: _Optional[int] = ...) -> None: ...

class StagingWriterLayout(_message.Message):
    __slots__ = ["bytes_per_token", "layer_begin", "layer_end", "num_heads", "offset_per_token", "writer_index"]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAYER_BEGIN_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WRITER_INDEX_FIELD_NUMBER: _ClassVar[int]
    bytes_per_token: int
    layer_begin: int
    layer_end: int
    num_heads: int
    offset_per_token: int
    writer_index: int
    def __init__(self, writer_index: _Optional[int] = ..., num_heads: _Optional[int] = ..., layer_begin: _Optional[int] = ..., layer_end: _Optional[int] = ..., bytes_per_token: _Optional[int] = ..., offset_per_token: _Optional[int] = ...) -> None: ...

class WatchWatermarkRequest(_message.Message):
    __slots__ = ["decode_dp_rank", "decode_tp_ranks"]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DECODE_TP_RANKS_FIELD_NUMBER: _ClassVar[int]
    decode_dp_rank: int
    decode_tp_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, decode_dp_rank: _Optional[int] = ..., decode_tp_ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class Watermark(_message.Message):
    __slots__ = ["decode_dp_rank", "decode_tp_rank", "head", "head_round", "live_allocations", "round", "size_bytes", "tail"]
    DECODE_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    DECODE_TP_RANK_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    HEAD_ROUND_FIELD_NUMBER: _ClassVar[int]
    LIVE_ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    decode_dp_rank: int
    decode_tp_rank: int
    head: int
    head_round: int
    live_allocations: int
    round: int
    size_bytes: int
    tail: int
    def __init__(self, decode_dp_rank: _Optional[int] = ..., decode_tp_rank: _Optional[int] = ..., round: _Optional[int] = ..., tail: _Optional[int] = ..., head_round: _Optional[int] = ..., head: _Optional[int] = ..., live_allocations: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...
