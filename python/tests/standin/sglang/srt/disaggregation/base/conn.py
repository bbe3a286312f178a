"""Stand-in of SGLang's transfer-backend base classes: KVArgs (an attribute
bag the queues fill), KVPoll, and the abstract manager, sender, receiver
and bootstrap server with SGLang's signatures."""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import Any, List, Optional


class StateType(str, enum.Enum):
    MAMBA = "mamba"
    SWA = "swa"
    DSA = "dsa"


@dataclasses.dataclass
class KVTransferMetric:
    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


class KVArgs:
    engine_rank: int
    kv_data_ptrs: List[int]
    kv_data_lens: List[int]
    kv_item_lens: List[int]
    aux_data_ptrs: List[int]
    aux_data_lens: List[int]
    aux_item_lens: List[int]
    state_types: List[StateType]
    page_size: int
    kv_head_num: int
    total_kv_head_num: int
    system_dp_rank: int
    pp_rank: int
    prefill_start_layer: int


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class BaseKVManager(abc.ABC):
    @abc.abstractmethod
    def __init__(self, args: KVArgs, disaggregation_mode: Any, server_args: Any,
                 is_mla_backend: Optional[bool] = False): ...

    @abc.abstractmethod
    def register_to_bootstrap(self): ...


class BaseKVSender(abc.ABC):
    @abc.abstractmethod
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: List[int],
                 pp_rank: int, req_has_disagg_prefill_dp_rank: bool = False): ...

    @abc.abstractmethod
    def init(self, num_kv_indices: int, aux_index: Optional[int] = None): ...

    @abc.abstractmethod
    def send(self, kv_indices: Any, state_indices: Optional[List] = None): ...

    def pop_decode_prefix_len(self) -> int:
        return 0

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0

    @abc.abstractmethod
    def get_transfer_metric(self) -> KVTransferMetric: ...

    @abc.abstractmethod
    def poll(self) -> KVPoll: ...

    @abc.abstractmethod
    def failure_exception(self): ...

    def clear(self):
        pass

    def abort(self):
        pass


class BaseKVReceiver(abc.ABC):
    @abc.abstractmethod
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None): ...

    @abc.abstractmethod
    def init(self, prefill_dp_rank: int): ...

    @abc.abstractmethod
    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None): ...

    @abc.abstractmethod
    def poll(self) -> KVPoll: ...

    @abc.abstractmethod
    def failure_exception(self): ...

    def clear(self):
        pass

    def abort(self):
        pass


class BaseKVBootstrapServer(abc.ABC):
    @abc.abstractmethod
    def __init__(self, host: str, port: int): ...
