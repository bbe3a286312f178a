"""Stand-in of SGLang's Common* transfer classes: the attributes and methods
the schedulers use beyond the abstract bases. The manager reads the rank's
parallel layout (SGLang: its runtime context; here: the server args and
KVArgs the stand-in queues fill), keeps request_status, failure_records
and, in DECODE mode, prefill_info_table; in PREFILL mode it registers with
the bootstrap server (register_to_bootstrap). Nothing here talks HTTP or
ZMQ: a call that would (SGLang's own bootstrap lookups) raises, so a test
fails if the plugin reaches it."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Dict, List, Optional

from sglang.srt.disaggregation.base.conn import (
    BaseKVBootstrapServer,
    BaseKVManager,
    BaseKVReceiver,
    BaseKVSender,
    KVArgs,
    KVPoll,
    KVTransferMetric,
)
from sglang.srt.disaggregation.utils import DisaggregationMode

_ports = itertools.count(41000)


class NotModeled(RuntimeError):
    """A stand-in path the decodeplane backend must not reach."""


@dataclasses.dataclass
class PrefillServerInfo:
    attn_tp_size: int
    attn_cp_size: int
    dp_size: int
    pp_size: int
    page_size: Optional[int]
    kv_cache_dtype: Optional[str]
    follow_bootstrap_room: bool
    enable_dsa_cache_layer_split: bool = False
    prefill_http_port: Optional[int] = None
    target_tp_rank: Optional[int] = None
    target_tp_ranks: Optional[List[int]] = None
    target_cp_ranks: Optional[List[int]] = None
    target_pp_ranks: Optional[List[int]] = None
    required_dst_info_num: Optional[int] = None
    required_prefill_response_num: Optional[int] = None


class CommonKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode, server_args: Any,
                 is_mla_backend: Optional[bool] = False):
        self.kv_args = args
        self.is_mla_backend = is_mla_backend
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.bootstrap_host = server_args.host
        self.bootstrap_port = server_args.disaggregation_bootstrap_port
        par = args.parallel  # the stand-in queues' stand-in for SGLang's runtime context
        self.attn_tp_size, self.attn_tp_rank = par["attn_tp_size"], par["attn_tp_rank"]
        self.attn_cp_size, self.attn_cp_rank = 1, 0
        self.attn_dp_size, self.attn_dp_rank = par.get("attn_dp_size", 1), par.get("attn_dp_rank", 0)
        self.system_dp_size = 1 if server_args.enable_dp_attention else server_args.dp_size
        self.system_dp_rank = args.system_dp_rank or 0
        self.pp_size, self.pp_rank = server_args.pp_size, args.pp_rank
        self.local_ip = "127.0.0.1"
        self.rank_port = next(_ports)  # SGLang binds a ZMQ socket here
        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.is_dummy_cp_rank = False
        if disaggregation_mode == DisaggregationMode.PREFILL:
            self.register_to_bootstrap()
            self.bootstrap_timeout = 300.0
        else:
            self.prefill_info_table: Dict[str, PrefillServerInfo] = {}
            self.addr_to_rooms_tracker: Dict[str, set] = {}
            self.required_prefill_response_num_table: Dict[int, int] = {}
            self.prefill_response_tracker: Dict[int, set] = {}
            self.waiting_timeout = 300.0

    def update_status(self, room: int, status: int) -> None:
        if status == KVPoll.Failed:
            if room in self.request_status:
                self.request_status[room] = status
            return
        self.request_status[room] = max(self.request_status.get(room, status), status)

    def record_failure(self, room: int, reason: str) -> None:
        self.failure_records[room] = reason

    def register_to_bootstrap(self):
        raise NotModeled("the stand-in does not serve SGLang's HTTP bootstrap (PUT /route)")

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        raise NotModeled("the stand-in does not serve SGLang's HTTP bootstrap (GET /route)")


class CommonKVSender(BaseKVSender):
    def __init__(self, mgr: CommonKVManager, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: List[int],
                 pp_rank: int, req_has_disagg_prefill_dp_rank: bool = False):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.bootstrap_server_url = bootstrap_addr
        self.aux_index = None
        self.conclude_state = None
        self.curr_idx = 0
        self._transfer_metric = KVTransferMetric()
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)
        if mgr.server_args.dp_size > 1 and not req_has_disagg_prefill_dp_rank \
                and mgr.server_args.load_balance_method != "follow_bootstrap_room":
            self._register_prefill_dp_rank()

    def _register_prefill_dp_rank(self):
        raise NotModeled("the stand-in does not serve SGLang's HTTP bootstrap (POST /register_dp_rank)")

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk

    def get_transfer_metric(self) -> KVTransferMetric:
        return self._transfer_metric

    def send(self, kv_indices: Any, state_indices: Optional[List] = None):
        pass

    def poll(self) -> int:
        pass

    def failure_exception(self):
        raise Exception("Fake KVReceiver Exception")

    def clear(self) -> None:
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)

    def abort(self):
        self.kv_mgr.record_failure(self.bootstrap_room, "Aborted by AbortReq.")
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed


class CommonKVReceiver(BaseKVReceiver):
    def __init__(self, mgr: CommonKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None):
        self.bootstrap_room = bootstrap_room
        self.bootstrap_addr = bootstrap_addr
        self.kv_mgr = mgr
        self.conclude_state = None
        self.require_staging = False
        mgr.addr_to_rooms_tracker.setdefault(bootstrap_addr, set()).add(bootstrap_room)
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, prefill_dp_rank: int):
        raise NotModeled("the stand-in does not serve SGLang's HTTP bootstrap (GET /route per rank)")

    @staticmethod
    def query_prefill_dp_ranks(bootstrap_addr: str, bootstrap_rooms: List[int]) -> Dict[str, int]:
        raise NotModeled("the stand-in does not serve SGLang's HTTP bootstrap (POST /query_dp_ranks)")

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None):
        raise NotImplementedError

    def failure_exception(self):
        raise Exception("Fake KVReceiver Exception")

    def clear(self) -> None:
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)

    def abort(self):
        self.kv_mgr.record_failure(self.bootstrap_room, "Aborted by AbortReq.")
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed


class CommonKVBootstrapServer(BaseKVBootstrapServer):
    """SGLang's aiohttp bootstrap server; the stand-in serves nothing."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
