from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from decodeplane.v1 import capacity_pb2 as _capacity_pb2
from decodeplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FleetDaemon(_message.Message):
    __slots__ = ["address", "capacity", "fingerprint", "incarnation", "layout", "self", "started_at", "version"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SELF_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    address: str
    capacity: _capacity_pb2.CapacityUpdate
    fingerprint: _common_pb2.Fingerprint
    incarnation: int
    layout: _common_pb2.KVLayout
    self: bool
    started_at: _timestamp_pb2.Timestamp
    version: str
    def __init__(self, address: _Optional[str] = ..., incarnation: _Optional[int] = ..., self: bool = ..., version: _Optional[str] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., capacity: _Optional[_Union[_capacity_pb2.CapacityUpdate, _Mapping]] = ..., fingerprint: _Optional[_Union[_common_pb2.Fingerprint, _Mapping]] = ...) -> None: ...

class FleetPrefill(_message.Message):
    __slots__ = ["attn_cp_size", "attn_tp_size", "bootstrap_addr", "dp_size", "expected_ranks", "hand_off_digests", "heard_here", "instance_id", "lease_id", "liveness", "pp_size", "refused", "registered_ranks", "registered_via"]
    ATTN_CP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ATTN_TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_RANKS_FIELD_NUMBER: _ClassVar[int]
    HAND_OFF_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    HEARD_HERE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_RANKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_VIA_FIELD_NUMBER: _ClassVar[int]
    attn_cp_size: int
    attn_tp_size: int
    bootstrap_addr: str
    dp_size: int
    expected_ranks: int
    hand_off_digests: _containers.RepeatedScalarFieldContainer[str]
    heard_here: _timestamp_pb2.Timestamp
    instance_id: str
    lease_id: int
    liveness: str
    pp_size: int
    refused: _containers.RepeatedCompositeFieldContainer[FleetRefusal]
    registered_ranks: int
    registered_via: str
    def __init__(self, bootstrap_addr: _Optional[str] = ..., instance_id: _Optional[str] = ..., registered_ranks: _Optional[int] = ..., expected_ranks: _Optional[int] = ..., attn_tp_size: _Optional[int] = ..., dp_size: _Optional[int] = ..., pp_size: _Optional[int] = ..., attn_cp_size: _Optional[int] = ..., liveness: _Optional[str] = ..., lease_id: _Optional[int] = ..., heard_here: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., registered_via: _Optional[str] = ..., hand_off_digests: _Optional[_Iterable[str]] = ..., refused: _Optional[_Iterable[_Union[FleetRefusal, _Mapping]]] = ...) -> None: ...

class FleetRefusal(_message.Message):
    __slots__ = ["differences", "digest"]
    DIFFERENCES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    differences: str
    digest: str
    def __init__(self, digest: _Optional[str] = ..., differences: _Optional[str] = ...) -> None: ...

class GetFleetRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetFleetResponse(_message.Message):
    __slots__ = ["daemons", "prefills", "registry", "truncated"]
    DAEMONS_FIELD_NUMBER: _ClassVar[int]
    PREFILLS_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    daemons: _containers.RepeatedCompositeFieldContainer[FleetDaemon]
    prefills: _containers.RepeatedCompositeFieldContainer[FleetPrefill]
    registry: RegistryState
    truncated: bool
    def __init__(self, registry: _Optional[_Union[RegistryState, _Mapping]] = ..., daemons: _Optional[_Iterable[_Union[FleetDaemon, _Mapping]]] = ..., prefills: _Optional[_Iterable[_Union[FleetPrefill, _Mapping]]] = ..., truncated: bool = ...) -> None: ...

class RegistryState(_message.Message):
    __slots__ = ["backend", "lease_ttl", "prefix", "reason", "revision", "since", "state"]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    backend: str
    lease_ttl: _duration_pb2.Duration
    prefix: str
    reason: str
    revision: int
    since: _timestamp_pb2.Timestamp
    state: str
    def __init__(self, backend: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., since: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ..., prefix: _Optional[str] = ..., lease_ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...
